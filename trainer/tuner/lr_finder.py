"""The learning-rate range test (Lightning's lr_find): train `num_training` steps with the rate rising from
`min_lr` to `max_lr`, record the smoothed loss, suggest the rate of its steepest fall; then put everything
back as it was (trainer/tuner/snapshot.py)."""

from __future__ import annotations

import logging
import warnings
from typing import TYPE_CHECKING, Any

import torch
from torch.optim.lr_scheduler import LRScheduler

from callbacks.base import Callback
from callbacks.finders import attrs
from tandem_core.errors import ConfigError, MissingFieldError, require
from tandem_core.optim import SchedulerConfig
from trainer.tuner.run import run_fit_trial
from trainer.tuner.snapshot import Snapshot

if TYPE_CHECKING:
    from trainer.task.base import Task
    from trainer.trainer import Trainer

log = logging.getLogger(__name__)


class _LRFinder:
    """The range test's results (``results["lr"]``, ``results["loss"]``), its suggestion and plot."""

    def __init__(self, mode: str, lr_min: float, lr_max: float, num_training: int) -> None:
        if mode not in ("linear", "exponential"):
            raise ConfigError(f"lr_find mode should be 'linear' or 'exponential', got {mode!r}.")
        self.mode, self.lr_min, self.lr_max, self.num_training = mode, lr_min, lr_max, num_training
        self.results: dict[str, Any] = {}
        self._total_batch_idx = 0
        self._optimal_idx: int | None = None

    def _exchange_scheduler(self, trainer: Trainer) -> None:
        """Every group starts at lr_min; the rate rises each optimizer step."""
        if len(trainer.optimizers) != 1:
            raise ConfigError(
                f"configure_optimizers returned {len(trainer.optimizers)} optimizers; lr_find works with one."
            )
        optimizer = trainer.optimizers[0]
        for group in optimizer.param_groups:
            group["lr"] = group["initial_lr"] = self.lr_min
        kind = _LinearLR if self.mode == "linear" else _ExponentialLR
        trainer.lr_scheduler_configs[:] = [
            SchedulerConfig(kind(optimizer, self.lr_max, self.num_training), interval="step")
        ]

    def suggestion(self, skip_begin: int = 10, skip_end: int = 1) -> float | None:
        """The rate where the loss falls fastest (the most negative gradient of loss over rate), skipping the
        first `skip_begin` and last `skip_end` points and non-finite losses; None with fewer than 2 points."""
        losses = torch.tensor(self.results["loss"][skip_begin:-skip_end])
        lrs = torch.tensor(self.results["lr"][skip_begin:-skip_end])
        finite = torch.isfinite(losses)
        losses, lrs = losses[finite], lrs[finite]
        if len(losses) < 2:
            log.error("lr_find: too few points for a suggestion; train more steps or use more data.")
            self._optimal_idx = None
            return None
        gradients = torch.gradient(losses, spacing=[lrs])[0]
        kept = torch.arange(len(self.results["loss"]))[skip_begin:-skip_end][finite]
        self._optimal_idx = int(kept[int(torch.argmin(gradients))])
        return self.results["lr"][self._optimal_idx]

    def plot(self, suggest: bool = False, show: bool = False, ax: Any = None) -> Any:
        """Loss against rate (log scale in exponential mode), the suggestion marked; needs matplotlib."""
        require("matplotlib", "lr_find's plot()", "tuner")
        import matplotlib.pyplot as plt

        fig = ax.figure if ax is not None else None
        if ax is None:
            fig, ax = plt.subplots()
        ax.plot(self.results["lr"], self.results["loss"])
        if self.mode == "exponential":
            ax.set_xscale("log")
        ax.set_xlabel("Learning rate")
        ax.set_ylabel("Loss")
        if suggest:
            self.suggestion()
            if self._optimal_idx:
                i = self._optimal_idx
                ax.plot(
                    self.results["lr"][i], self.results["loss"][i], markersize=10, marker="o", color="red"
                )
        if show:
            plt.show()
        return fig


class _RisingLR(LRScheduler):
    """From base_lr toward end_lr over num_iter steps (Lightning's schedule: step i uses r = (i + 1) / num_iter
    from the second step on)."""

    def __init__(
        self, optimizer: torch.optim.Optimizer, end_lr: float, num_iter: int, last_epoch: int = -1
    ) -> None:
        self.end_lr, self.num_iter = end_lr, num_iter
        super().__init__(optimizer, last_epoch)

    def _at(self, base: float, r: float) -> float:
        raise NotImplementedError

    def get_lr(self) -> list[float]:
        r = (self.last_epoch + 1) / self.num_iter
        self._lr = [self._at(b, r) for b in self.base_lrs] if self.last_epoch > 0 else list(self.base_lrs)
        return self._lr

    @property
    def lr(self) -> list[float]:
        return self._lr


class _LinearLR(_RisingLR):
    def _at(self, base: float, r: float) -> float:
        return base + r * (self.end_lr - base)


class _ExponentialLR(_RisingLR):
    def _at(self, base: float, r: float) -> float:
        return base * (self.end_lr / base) ** r


class _LRCallback(Callback):
    """Records the rate before and the smoothed loss after each optimizer step; stops when the smoothed loss
    exceeds `early_stop_threshold` times the best (rank 0 decides for every rank)."""

    def __init__(
        self, num_training: int, early_stop_threshold: float | None, show_bar: bool, beta: float = 0.98
    ) -> None:
        self.num_training, self.early_stop_threshold, self.beta = num_training, early_stop_threshold, beta
        self.losses: list[float] = []
        self.lrs: list[float] = []
        self.avg_loss = self.best_loss = 0.0
        self.show_bar, self.bar = show_bar, None

    def on_train_batch_start(self, trainer: Trainer, task: Task, batch: Any, batch_idx: int) -> None:
        if (batch_idx + 1) % trainer.accumulate_grad_batches:
            return
        if self.show_bar and self.bar is None:
            from tqdm import tqdm

            self.bar = tqdm(desc="Finding best initial lr", total=self.num_training)
        self.lrs.append(trainer.lr_scheduler_configs[0].scheduler.lr[0])

    def on_train_batch_end(
        self, trainer: Trainer, task: Task, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if (batch_idx + 1) % trainer.accumulate_grad_batches:
            return
        if outputs is None or (isinstance(outputs, dict) and not outputs):
            self.losses.append(float("nan"))
            return
        if self.bar is not None:
            self.bar.update()
        loss = float((outputs if isinstance(outputs, torch.Tensor) else outputs["loss"]).item())
        step = trainer.global_step
        self.avg_loss = self.beta * self.avg_loss + (1 - self.beta) * loss
        smoothed = self.avg_loss / (1 - self.beta ** (step + 1))
        if (
            self.early_stop_threshold is not None
            and step > 1
            and smoothed > self.early_stop_threshold * self.best_loss
        ):
            trainer.should_stop = True
        trainer.should_stop = trainer.strategy.comm.broadcast(trainer.should_stop)
        if smoothed < self.best_loss or step == 1:
            self.best_loss = smoothed
        self.losses.append(smoothed)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def lr_attr_name(task: Any, attr_name: str = "") -> str:
    """The task's learning-rate field: `attr_name`, else 'lr' or 'learning_rate' (attribute or hparam)."""
    if attr_name:
        if not attrs.has(task, attr_name):
            raise MissingFieldError(
                f"lr_find(attr_name={attr_name!r}): no such field on the task or in its hparams."
            )
        return attr_name
    for name in ("lr", "learning_rate"):
        if attrs.has(task, name):
            return name
    raise MissingFieldError(
        "lr_find(update_attr=True) sets the task's 'lr' or 'learning_rate' (an attribute or hparam); the task has "
        "neither: add one, or name yours with attr_name=..."
    )


def lr_find(
    trainer: Trainer, task: Task, min_lr: float = 1e-8, max_lr: float = 1.0, num_training: int = 100,
    mode: str = "exponential", early_stop_threshold: float | None = 4.0, update_attr: bool = False, attr_name: str = "",
) -> _LRFinder | None:  # fmt: skip
    """Run the range test on the trainer's current run (called when fit starts) and restore it afterwards;
    with `update_attr`, the suggestion becomes the task's rate and the optimizer's."""
    if trainer.config.fast_dev_run:
        warnings.warn("lr_find is skipped under fast_dev_run.", UserWarning, stacklevel=2)
        return None
    if update_attr:
        attr_name = lr_attr_name(task, attr_name)
    finder = _LRFinder(mode, min_lr, max_lr, num_training)
    snap = Snapshot(trainer)
    bar = trainer.progress_bar_callback is not None and trainer.is_global_zero
    recorder = _LRCallback(num_training, early_stop_threshold, show_bar=bar)
    start = trainer.global_step
    try:
        snap.isolate([recorder])
        finder._exchange_scheduler(trainer)
        limit = {"max_steps": start + num_training, "limit_val_batches": num_training}
        run_fit_trial(trainer, limit)
        if trainer.global_step != start + num_training:
            log.info(
                f"LR finder stopped early after {trainer.global_step - start} steps due to diverging loss."
            )
        finder.results = trainer.strategy.comm.broadcast({"lr": recorder.lrs, "loss": recorder.losses})
        finder._total_batch_idx = trainer.state.batch_in_epoch
    finally:
        recorder.close()
        snap.restore()
        snap.restore_loaders()
    if update_attr:
        lr = finder.suggestion()
        if lr is not None:
            attrs.set_everywhere(task, attr_name, lr)
            for opt in trainer.optimizers:
                for group in opt.param_groups:
                    group["lr"] = lr
            log.info(f"Learning rate set to {lr}")
    return finder
