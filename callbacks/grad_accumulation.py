"""GradientAccumulationScheduler: change accumulate_grad_batches by epoch."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

from callbacks.base import Callback
from tandem_core.errors import ConfigError, TaskError
from tandem_core.hooks import overrides

if TYPE_CHECKING:
    from trainer.task.base import Task
    from trainer.trainer import Trainer


class GradientAccumulationScheduler(Callback):
    """``scheduling={epoch: k}``: from that (0-based) epoch on, k micro-batches per optimizer step (1 before
    the first listed epoch). It sets ``trainer.accumulate_grad_batches`` at each epoch's start, as if the
    Trainer had been given that value for the epoch. Example: ``GradientAccumulationScheduler({0: 8, 4: 4, 8: 1})``.
    """

    def __init__(self, scheduling: dict[int, int]) -> None:
        if not scheduling:
            raise ConfigError(
                "GradientAccumulationScheduler(scheduling=...) needs at least one {epoch: factor}."
            )
        if any(not isinstance(k, int) or isinstance(k, bool) or k < 0 for k in scheduling):
            raise ConfigError(f"scheduling's epochs must be ints >= 0, got {list(scheduling)}.")
        if any(not isinstance(v, int) or isinstance(v, bool) or v < 1 for v in scheduling.values()):
            raise ConfigError(
                f"scheduling's accumulation factors must be ints >= 1, got {list(scheduling.values())}."
            )
        if min(scheduling) != 0:
            scheduling.update({0: 1})  # (Lightning updates the given dict too)
        self.scheduling = scheduling
        self.epochs = sorted(scheduling)

    def going_to_accumulate_grad_batches(self) -> bool:
        """Whether any epoch of the schedule accumulates more than one batch."""
        return any(v > 1 for v in self.scheduling.values())

    def get_accumulate_grad_batches(self, epoch: int) -> int:
        """The number of batches accumulated in `epoch`, by the schedule."""
        return next(self.scheduling[e] for e in reversed(self.epochs) if epoch >= e)

    def on_train_start(self, trainer: Trainer, task: Task) -> None:
        """Refuse what cannot accumulate (manual optimization, a Trainer value of its own); a run resumed
        inside an epoch (which gets no on_train_epoch_start, as in Lightning) takes that epoch's value here."""
        if not task.automatic_optimization:
            raise TaskError(
                "GradientAccumulationScheduler works with automatic optimization only; remove it, or "
                "accumulate in training_step yourself."
            )
        custom = overrides(task, "optimizer_step") or overrides(task, "optimizer_zero_grad")
        if custom and self.going_to_accumulate_grad_batches():
            warnings.warn(
                "with accumulation, the task's optimizer_step/optimizer_zero_grad run once per optimizer step, "
                "not once per batch.",
                UserWarning,
                stacklevel=2,
            )
        if trainer.accumulate_grad_batches != 1:
            raise ConfigError(
                "Trainer(accumulate_grad_batches=...) and a GradientAccumulationScheduler both set the accumulation; "
                "remove one of them."
            )
        trainer.accumulate_grad_batches = self.get_accumulate_grad_batches(trainer.current_epoch)

    def on_train_epoch_start(self, trainer: Trainer, *_: Any) -> None:
        trainer.accumulate_grad_batches = self.get_accumulate_grad_batches(trainer.current_epoch)
