"""LearningRateFinder: run the learning-rate range test when fit starts (trainer/tuner/lr_finder.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from callbacks.base import Callback
from tandem_core.errors import ConfigError

if TYPE_CHECKING:
    from trainer.task.base import Task
    from trainer.trainer import Trainer


class LearningRateFinder(Callback):
    """At the start of fit, trains `num_training_steps` steps with the rate rising from `min_lr` to `max_lr`
    (`mode` "exponential" or "linear"), stopping early when the loss exceeds `early_stop_threshold` times its
    best; then restores the model, optimizer, loop and random state and, with `update_attr`, sets the task's
    rate (its `attr_name`, else 'lr' or 'learning_rate') to the suggestion. The result is ``optimal_lr``.
    Subclass and call ``self.lr_find(trainer, task)`` from another hook to run it at another moment.
    Example: ``Trainer(callbacks=[LearningRateFinder(num_training_steps=50)])``.
    """

    SUPPORTED_MODES = ("linear", "exponential")

    def __init__(
        self, min_lr: float = 1e-8, max_lr: float = 1, num_training_steps: int = 100, mode: str = "exponential",
        early_stop_threshold: float | None = 4.0, update_attr: bool = True, attr_name: str = "",
    ) -> None:  # fmt: skip
        mode = mode.lower()
        if mode not in self.SUPPORTED_MODES:
            raise ConfigError(
                f"LearningRateFinder mode should be one of {self.SUPPORTED_MODES}, got {mode!r}."
            )
        self._min_lr, self._max_lr, self._num_training_steps = min_lr, max_lr, num_training_steps
        self._mode, self._early_stop_threshold = mode, early_stop_threshold
        self._update_attr, self._attr_name = update_attr, attr_name
        self.optimal_lr: Any = None

    def lr_find(self, trainer: Trainer, pl_module: Task) -> None:
        """Run the learning-rate search now and keep the result in `optimal_lr`."""
        self.optimal_lr = trainer._lr_find(
            pl_module, min_lr=self._min_lr, max_lr=self._max_lr, num_training=self._num_training_steps,
            mode=self._mode, early_stop_threshold=self._early_stop_threshold, update_attr=self._update_attr,
            attr_name=self._attr_name,
        )  # fmt: skip

    def on_fit_start(self, trainer: Trainer, task: Task) -> None:
        self.lr_find(trainer, task)
