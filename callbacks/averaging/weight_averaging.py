"""WeightAveraging and EMAWeightAveraging: an averaged copy of the task (torch.optim.swa_utils.AveragedModel)
updated after optimizer steps; validation and the end of training use the averaged weights."""

from __future__ import annotations

import contextlib
import copy
import itertools
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch.optim.swa_utils import AveragedModel, get_ema_avg_fn

from callbacks.base import Callback
from tandem_core.errors import ConfigError
from tandem_core.hooks import overrides

if TYPE_CHECKING:
    from trainer.task.base import Task
    from trainer.trainer import Trainer


@contextlib.contextmanager
def detached(task: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """The task without its run (trainer, optimizer wrappers) for as long as it is deep-copied, so that a copy
    holds the layers only (Lightning's modules drop their trainer when copied, too)."""
    saved = {k: task.__dict__[k] for k in ("_trainer", "_optimizers") if k in task.__dict__}
    task.__dict__.update(_trainer=None, _optimizers=[])
    try:
        yield task
    finally:
        task.__dict__.update(saved)


def detached_copy(task: torch.nn.Module) -> torch.nn.Module:
    """A deep copy of the task's layers, parameters and buffers, without the run it is attached to."""
    with detached(task):
        return copy.deepcopy(task)


def refuse_sharded(trainer: Trainer, name: str) -> None:
    """Averaging needs every parameter whole on every process: refuse FSDP's sharded ones, saying why."""
    if trainer.strategy.name in ("fsdp", "model_parallel"):
        raise ConfigError(
            f"{name} keeps a whole copy of every parameter and averages it, but strategy="
            f"{trainer.strategy.name!r} shards the "
            "parameters across processes (Lightning refuses sharded models too); use strategy='ddp'."
        )


class WeightAveraging(Callback):
    """Keeps ``AveragedModel(task, device, use_buffers, **kwargs)`` and updates it after every optimizer step
    for which ``should_update(step_idx=...)`` is True, and at each epoch's end when ``should_update(epoch_idx=...)``
    is. Validation runs on the averaged weights; when training ends they replace the task's. Checkpoints
    hold the averaged weights in ``state_dict`` (what load_from_checkpoint gives) and the current ones in
    ``current_model_state``, so a resumed run continues both. `kwargs` reach AveragedModel (``avg_fn``,
    ``multi_avg_fn``); without them it is the equal average (SWA). Example::

        class LateEMA(WeightAveraging):
            def __init__(self): super().__init__(avg_fn=get_ema_avg_fn(0.99))
            def should_update(self, step_idx=None, epoch_idx=None): return step_idx is not None and step_idx >= 100
    """

    def __init__(
        self, device: torch.device | str | int | None = None, use_buffers: bool = True, **kwargs: Any
    ) -> None:
        self._device = torch.device(device) if isinstance(device, str) else device
        self._use_buffers = use_buffers
        self._kwargs = kwargs
        self._average_model: AveragedModel | None = None
        self._latest_update_step = 0
        self._latest_update_epoch = -1

    def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
        """Update after optimizer step `step_idx` (0-based) or at the end of epoch `epoch_idx`; default: every step."""
        return step_idx is not None

    def setup(self, trainer: Trainer, task: Task, stage: str) -> None:
        """Make the averaged copy when fit begins."""
        if stage != "fit":
            return
        refuse_sharded(trainer, type(self).__name__)
        if overrides(task, "configure_model"):
            warnings.warn(
                f"{type(self).__name__} with a task that overrides configure_model: the layers are built now, "
                "whole (weight averaging does not shard them), so that the averaged copy has them too.",
                UserWarning,
                stacklevel=2,
            )
            task.configure_model()
        device = self._device if self._device is not None else trainer.strategy.root_device
        with detached(task):
            self._average_model = AveragedModel(
                task, device=device, use_buffers=self._use_buffers, **self._kwargs
            )

    def on_train_batch_end(
        self, trainer: Trainer, task: Task, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """After an optimizer step (not inside an accumulation window), update if should_update says so."""
        step = trainer.global_step
        if step > self._latest_update_step and self.should_update(step_idx=step - 1):
            assert self._average_model is not None
            self._average_model.update_parameters(task)
            self._latest_update_step = step

    def on_train_epoch_end(self, trainer: Trainer, task: Task) -> None:
        epoch = trainer.current_epoch
        if epoch > self._latest_update_epoch and self.should_update(epoch_idx=epoch):
            assert self._average_model is not None
            self._average_model.update_parameters(task)
            self._latest_update_epoch = epoch

    def on_train_end(self, trainer: Trainer, task: Task) -> None:
        """The averaged weights (and buffers) become the task's."""
        assert self._average_model is not None
        for avg, cur in _pairs(self._average_model.module, task):
            cur.data.copy_(avg.data)

    def on_validation_epoch_start(self, trainer: Trainer, task: Task) -> None:
        if self._average_model is not None:
            self._swap(task)

    def on_validation_epoch_end(self, trainer: Trainer, task: Task) -> None:
        if self._average_model is not None:
            self._swap(task)

    def _swap(self, task: Task) -> None:
        assert self._average_model is not None
        for avg, cur in _pairs(self._average_model.module, task):
            held = avg.data.clone()
            avg.data.copy_(cur.data)
            cur.data.copy_(held)

    # ----- checkpoints ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        # the epoch too (Lightning keeps only the step): epoch-end updates then resume exactly as well
        return {
            "latest_update_step": self._latest_update_step,
            "latest_update_epoch": self._latest_update_epoch,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._latest_update_step = state["latest_update_step"]
        self._latest_update_epoch = state.get("latest_update_epoch", -1)

    def on_save_checkpoint(self, trainer: Trainer, task: Task, checkpoint: dict[str, Any]) -> None:
        """The averaged weights go into state_dict, the current ones into current_model_state."""
        if self._average_model is None:
            return  # outside fit: the task's weights (averaged, if training ended) are what there is
        averaged = self._average_model.state_dict()
        checkpoint["current_model_state"] = checkpoint["state_dict"]
        checkpoint["state_dict"] = {
            k[len("module.") :]: v for k, v in averaged.items() if k.startswith("module.")
        }
        checkpoint["averaging_state"] = {k: v for k, v in averaged.items() if not k.startswith("module.")}

    def on_load_checkpoint(self, trainer: Trainer, task: Task, checkpoint: dict[str, Any]) -> None:
        """Resume both: the averaged model from state_dict, the task from current_model_state."""
        if self._average_model is None:
            if trainer.state.entry == "fit":
                warnings.warn(
                    f"{type(self).__name__} was not set up; its state is not restored.", stacklevel=2
                )
            return
        if "current_model_state" in checkpoint and "averaging_state" in checkpoint:
            averaged = {"module." + k: v for k, v in checkpoint["state_dict"].items()}
            self._average_model.load_state_dict({**averaged, **checkpoint["averaging_state"]})
            task.load_state_dict(checkpoint["current_model_state"])
            checkpoint["state_dict"] = checkpoint["current_model_state"]  # for a loader that reads it later
        else:
            warnings.warn(
                f"the checkpoint was not written with {type(self).__name__}: the averaged model starts from its "
                "weights too.",
                UserWarning,
                stacklevel=2,
            )
            self._average_model.module.load_state_dict(copy.deepcopy(checkpoint["state_dict"]), strict=False)


def _pairs(averaged: torch.nn.Module, task: torch.nn.Module) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    return zip(
        itertools.chain(averaged.parameters(), averaged.buffers()),
        itertools.chain(task.parameters(), task.buffers()),
    )


class EMAWeightAveraging(WeightAveraging):
    """An exponential moving average of the weights: ``avg = decay * avg + (1 - decay) * weights``, updated every
    `update_every_n_steps` optimizer steps from `update_starting_at_step` on, and at each epoch end from
    `update_starting_at_epoch` on (None: never at epoch ends). Example: ``EMAWeightAveraging(decay=0.999)``."""

    def __init__(
        self,
        device: torch.device | str | int | None = None,
        use_buffers: bool = True,
        decay: float = 0.999,
        update_every_n_steps: int = 1,
        update_starting_at_step: int | None = None,
        update_starting_at_epoch: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(device=device, use_buffers=use_buffers, **kwargs, avg_fn=get_ema_avg_fn(decay=decay))
        self.update_every_n_steps = update_every_n_steps
        self.update_starting_at_step = update_starting_at_step
        self.update_starting_at_epoch = update_starting_at_epoch

    def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
        if step_idx is not None:
            started = self.update_starting_at_step is None or step_idx >= self.update_starting_at_step
            if started and self.update_every_n_steps > 0 and step_idx % self.update_every_n_steps == 0:
                return True
        if epoch_idx is not None:
            return self.update_starting_at_epoch is not None and epoch_idx >= self.update_starting_at_epoch
        return False
