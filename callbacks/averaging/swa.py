"""StochasticWeightAveraging: Lightning's epoch-wise SWA on torch.optim.swa_utils (the SWALR schedule, the
average of the weights at the start of the SWA epochs, and update_bn for the batch-norm statistics)."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.optim.swa_utils import SWALR, update_bn

from callbacks.averaging.weight_averaging import detached_copy, refuse_sharded
from callbacks.base import Callback
from tandem_core.errors import ConfigError
from tandem_core.optim import SchedulerConfig

if TYPE_CHECKING:
    from trainer.task.base import Task
    from trainer.trainer import Trainer


_CPU = torch.device("cpu")


log = logging.getLogger(__name__)


class StochasticWeightAveraging(Callback):
    """From epoch `swa_epoch_start` (1-based; a float is that fraction of max_epochs) the learning rate follows
    ``SWALR(swa_lrs, annealing_epochs, annealing_strategy)`` in place of the task's scheduler, and the weights
    at the start of each epoch until the last are averaged (`avg_fn`, default the equal average) into a copy
    kept on `device`. When the last epoch ends the average becomes the task's weights, and for a model with
    batch norm its statistics are recomputed by one pass over the training data (torch's update_bn, each
    batch through training_step, no gradients). Example: ``StochasticWeightAveraging(swa_lrs=1e-2)``.

    Differs from Lightning 2.6 on purpose in one place: Lightning recomputes the statistics in an extra
    training epoch whose last batch takes an optimizer step with the last real step's stale gradients, so its
    final weights are not the average (and current_epoch ends at max_epochs + 1); here they are.
    """

    def __init__(
        self,
        swa_lrs: float | list[float],
        swa_epoch_start: int | float = 0.8,
        annealing_epochs: int = 10,
        annealing_strategy: str = "cos",
        avg_fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
        device: torch.device | str | None = _CPU,
    ) -> None:
        bad_start = (isinstance(swa_epoch_start, int) and swa_epoch_start < 1) or (
            isinstance(swa_epoch_start, float) and not 0 <= swa_epoch_start <= 1
        )
        if bad_start:
            raise ConfigError(
                f"swa_epoch_start should be an int >= 1 or a float in [0, 1], got {swa_epoch_start!r}."
            )
        lrs = swa_lrs if isinstance(swa_lrs, list) else [swa_lrs]
        if not isinstance(swa_lrs, (float, list)) or not all(isinstance(lr, float) and lr > 0 for lr in lrs):
            raise ConfigError(
                f"swa_lrs should be a positive float or a list of positive floats, got {swa_lrs!r}."
            )
        if annealing_strategy not in ("cos", "linear"):
            raise ConfigError(f"annealing_strategy must be 'cos' or 'linear', got {annealing_strategy!r}.")
        if avg_fn is not None and not callable(avg_fn):
            raise ConfigError("StochasticWeightAveraging(avg_fn=...) must be callable.")
        if device is not None and not isinstance(device, (torch.device, str)):
            raise ConfigError(f"device must be a torch.device or a str, got {device!r}.")
        self._swa_epoch_start = swa_epoch_start
        self._swa_lrs = swa_lrs
        self._annealing_epochs = annealing_epochs
        self._annealing_strategy = annealing_strategy
        self._avg_fn = avg_fn or self.avg_fn
        self._device = device
        self.n_averaged: torch.Tensor | None = None
        self._average_model: nn.Module | None = None
        self._trainer: Trainer | None = None
        self._initialized = False
        self._swa_scheduler: Any = None
        self._scheduler_state: dict[str, Any] | None = None
        self._init_n_averaged = 0
        self._latest_update_epoch = -1
        self._max_epochs = -1
        self._model_contains_batch_norm = False

    @property
    def swa_start(self) -> int:
        """The first averaged epoch, 0-based."""
        assert isinstance(self._swa_epoch_start, int)
        return max(self._swa_epoch_start - 1, 0)

    @property
    def swa_end(self) -> int | float:
        """The last averaged epoch, 0-based (inf with max_epochs=-1)."""
        return float("inf") if self._max_epochs == -1 else self._max_epochs - 1

    @staticmethod
    def pl_module_contains_batch_norm(task: nn.Module) -> bool:
        """Whether the task has batch-norm layers (their statistics are recomputed after averaging)."""
        return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in task.modules())

    @staticmethod
    def avg_fn(averaged: torch.Tensor, current: torch.Tensor, num_averaged: torch.Tensor) -> torch.Tensor:
        """The equal average, torch.optim.swa_utils' default."""
        return averaged + (current - averaged) / (num_averaged + 1)

    # ----- set-up --------------------------------------------------------------------------------
    def setup(self, trainer: Trainer, task: Task, stage: str) -> None:
        if stage != "fit":
            return
        refuse_sharded(trainer, "StochasticWeightAveraging")
        self._trainer = trainer
        self._average_model = detached_copy(task)

    def on_fit_start(self, trainer: Trainer, task: Task) -> None:
        if len(trainer.optimizers) != 1:
            raise ConfigError("StochasticWeightAveraging works with one optimizer (as in Lightning).")
        if len(trainer.lr_scheduler_configs) > 1 and not self._initialized:
            raise ConfigError(
                "StochasticWeightAveraging works with at most one lr scheduler (as in Lightning)."
            )
        if isinstance(self._swa_epoch_start, float):
            if trainer.max_epochs == -1:
                raise ConfigError(
                    "swa_epoch_start as a float needs max_epochs; with max_epochs=-1 pass an int."
                )
            self._swa_epoch_start = int(trainer.max_epochs * self._swa_epoch_start)
        self._model_contains_batch_norm = self.pl_module_contains_batch_norm(task)
        self._max_epochs = trainer.max_epochs

    def _make_scheduler(self, trainer: Trainer, state: dict[str, Any] | None) -> None:
        """SWALR in place of the task's scheduler (Lightning's arguments, so the same learning rates)."""
        optimizer = trainer.optimizers[0]
        if isinstance(self._swa_lrs, float):
            self._swa_lrs = [self._swa_lrs] * len(optimizer.param_groups)
        lrs = [g["lr"] for g in optimizer.param_groups]
        for lr, group in zip(self._swa_lrs, optimizer.param_groups):
            group["initial_lr"] = lr
        self._swa_scheduler = SWALR(
            optimizer,
            swa_lr=self._swa_lrs,
            anneal_epochs=self._annealing_epochs,
            anneal_strategy=self._annealing_strategy,  # type: ignore[arg-type]
            last_epoch=trainer.max_epochs if self._annealing_strategy == "cos" else -1,
        )
        if state is not None:  # resuming: the optimizer's rates are the checkpoint's, not a fresh SWALR's
            self._swa_scheduler.load_state_dict(state)
            for lr, group in zip(lrs, optimizer.param_groups):
                group["lr"] = lr
        config = SchedulerConfig(self._swa_scheduler, interval="epoch", frequency=1)
        if trainer.lr_scheduler_configs:
            old = trainer.lr_scheduler_configs[0]
            if old.scheduler is not self._swa_scheduler and (old.interval != "epoch" or old.frequency != 1):
                warnings.warn(f"SWA steps its scheduler every epoch; found {old}.", UserWarning, stacklevel=2)
            if (
                old.scheduler is not self._swa_scheduler and trainer.is_global_zero
            ):  # (logged as Lightning does)
                log.info(f"Swapping scheduler `{type(old.scheduler).__name__}` for `SWALR`")
            trainer.lr_scheduler_configs[0] = config
        else:
            trainer.lr_scheduler_configs.append(config)
        self._initialized = True

    # ----- the averaging ---------------------------------------------------------------------------
    def on_train_epoch_start(self, trainer: Trainer, task: Task) -> None:
        epoch = trainer.current_epoch
        in_swa = self.swa_start <= epoch <= self.swa_end
        if in_swa and not self._initialized:
            if self._scheduler_state is None and epoch != self.swa_start:
                warnings.warn("SWA starts after swa_start without state from a checkpoint.", stacklevel=2)
            self._make_scheduler(trainer, self._scheduler_state)
        if in_swa and self.n_averaged is None:
            self.n_averaged = torch.tensor(self._init_n_averaged, dtype=torch.long)
        if in_swa and epoch > self._latest_update_epoch:
            assert self._average_model is not None and self.n_averaged is not None
            self._average_model.to(self._device or task.device)
            self.update_parameters(self._average_model, task, self.n_averaged, self._avg_fn)
            self._latest_update_epoch = epoch

    @staticmethod
    def update_parameters(
        average: nn.Module, model: nn.Module, n_averaged: torch.Tensor, avg_fn: Callable
    ) -> None:
        """One more model in the average (torch.optim.swa_utils.AveragedModel.update_parameters' rule)."""
        for p_avg, p_model in zip(average.parameters(), model.parameters()):
            cur = p_model.detach().to(p_avg.device)
            p_avg.detach().copy_(
                cur if n_averaged == 0 else avg_fn(p_avg.detach(), cur, n_averaged.to(p_avg.device))
            )
        n_averaged += 1

    @staticmethod
    def transfer_weights(src: nn.Module, dst: nn.Module) -> None:
        """Copy the averaged model's parameters into the task (Lightning's static method of the same name)."""
        for p_src, p_dst in zip(src.parameters(), dst.parameters()):
            p_dst.detach().copy_(p_src.to(p_dst.device))

    def on_train_end(self, trainer: Trainer, task: Task) -> None:
        """After the last epoch: the average becomes the task's weights, then the batch-norm statistics follow."""
        finished = trainer.current_epoch - 1 == self.swa_end or self._max_epochs == -1
        if not finished or self._average_model is None or self.n_averaged is None:
            return  # stopped before the last epoch: the task keeps its own weights (as in Lightning)
        self.transfer_weights(self._average_model, task)
        if self._model_contains_batch_norm and self._max_epochs != -1:
            recompute_batch_norm(trainer, task)

    # ----- checkpoints ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "n_averaged": 0 if self.n_averaged is None else int(self.n_averaged.item()),
            "latest_update_epoch": self._latest_update_epoch,
            "scheduler_state": None if self._swa_scheduler is None else self._swa_scheduler.state_dict(),
            "average_model_state": None if self._average_model is None else self._average_model.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._init_n_averaged = int(state["n_averaged"])
        self.n_averaged = None
        self._latest_update_epoch = state["latest_update_epoch"]
        self._scheduler_state = state["scheduler_state"]
        if self._average_model is not None and state["average_model_state"] is not None:
            self._average_model.load_state_dict(state["average_model_state"])
        trainer = self._trainer
        if self._scheduler_state is not None and trainer is not None and trainer.optimizers:
            # the optimizers exist already: put SWALR back now, so that the scheduler and loop states that
            # are restored next (a step due at an epoch's end, say) reach it and not the task's own scheduler
            self._make_scheduler(trainer, self._scheduler_state)


class _TrainingSteps(nn.Module):
    """What torch's update_bn calls `model(input)` on: each input is one training batch, run through the
    task's training_step (the forward the user wrote), on the device, under the strategy's autocast. The
    task is called directly: a strategy's step would broadcast rank 0's statistics before every batch."""

    def __init__(self, trainer: Trainer, task: Task) -> None:
        super().__init__()
        self.task = task  # a submodule, so update_bn finds its batch-norm layers
        self._trainer = trainer

    def forward(self, item: _Batch) -> Any:
        t = self._trainer
        with t.strategy.autocast():
            return self.task.training_step(t._to_device(item.batch), item.index)


class _Batch:
    """A batch and its index; not a list or tuple, so update_bn passes it whole."""

    def __init__(self, index: int, batch: Any) -> None:
        self.index, self.batch = index, batch


def recompute_batch_norm(trainer: Trainer, task: Task) -> None:
    """torch.optim.swa_utils.update_bn over one epoch of the training data: running statistics reset, then
    accumulated as a cumulative average (momentum None) in training mode without gradients."""
    from itertools import islice

    n = trainer.num_training_batches
    loader = trainer.loaders["train"][
        0
    ]  # several loaders: a CombinedLoader, its batches without their indices
    source = (b for b, _, _ in iter(loader)) if hasattr(loader, "flattened") else loader
    batches = (_Batch(i, b) for i, b in enumerate(islice(source, None if n == float("inf") else int(n))))
    with torch.no_grad():
        update_bn(batches, _TrainingSteps(trainer, task))
        comm = trainer.strategy.comm
        if comm.world_size > 1:  # each rank saw its shard: every rank takes the mean over all of them
            for m in task.modules():
                if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.running_mean is not None:
                    for buf in (m.running_mean, m.running_var):
                        buf.copy_(comm.reduce(buf.clone(), "mean"))
