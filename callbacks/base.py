"""Callback: hooks that receive (trainer, task, ...), as Lightning's receive (trainer, pl_module, ...)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from trainer.task import Task
    from trainer.trainer import Trainer


class Callback:
    """Override the hooks you need; only overridden hooks are called, so the others cost nothing.

    Example::

        class PrintLoss(Callback):
            def on_train_epoch_end(self, trainer, task):
                print(trainer.callback_metrics["train/loss"])
    """

    #: Monitoring callbacks (checkpointing, early stopping) run after the task's own hook.
    monitoring = False

    @property
    def state_key(self) -> str:
        """Key of this callback's state in a checkpoint."""
        return type(self).__qualname__

    def state_dict(self) -> dict[str, Any]:
        """State saved in checkpoints."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what state_dict returned."""

    def setup(self, trainer: Trainer, task: Task, stage: str) -> None:
        """Called at the start of fit/validate/test/predict."""

    def teardown(self, trainer: Trainer, task: Task, stage: str) -> None:
        """Called at the end of fit/validate/test/predict."""

    def on_fit_start(self, trainer: Trainer, task: Task) -> None:
        """Called at the start of fit."""

    def on_fit_end(self, trainer: Trainer, task: Task) -> None:
        """Called at the end of fit."""

    def on_sanity_check_start(self, trainer: Trainer, task: Task) -> None:
        """Called before the sanity validation steps."""

    def on_sanity_check_end(self, trainer: Trainer, task: Task) -> None:
        """Called after the sanity validation steps."""

    def on_train_start(self, trainer: Trainer, task: Task) -> None:
        """Called before the first training epoch."""

    def on_train_end(self, trainer: Trainer, task: Task) -> None:
        """Called after the last training epoch."""

    def on_train_epoch_start(self, trainer: Trainer, task: Task) -> None:
        """Called at the start of each training epoch."""

    def on_train_epoch_end(self, trainer: Trainer, task: Task) -> None:
        """Called at the end of each training epoch."""

    def on_train_batch_start(self, trainer: Trainer, task: Task, batch: Any, batch_idx: int) -> None:
        """Called before training_step."""

    def on_train_batch_end(
        self, trainer: Trainer, task: Task, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Called after a training batch (and its optimizer step, if any)."""

    def on_validation_start(self, trainer: Trainer, task: Task) -> None:
        """Called before a validation run."""

    def on_validation_end(self, trainer: Trainer, task: Task) -> None:
        """Called after a validation run."""

    def on_validation_epoch_start(self, trainer: Trainer, task: Task) -> None:
        """Called at the start of a validation epoch."""

    def on_validation_epoch_end(self, trainer: Trainer, task: Task) -> None:
        """Called at the end of a validation epoch."""

    def on_validation_batch_start(
        self, trainer: Trainer, task: Task, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        """Called before validation_step."""

    def on_validation_batch_end(
        self, trainer: Trainer, task: Task, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        """Called after validation_step."""

    def on_test_start(self, trainer: Trainer, task: Task) -> None:
        """Called before testing."""

    def on_test_end(self, trainer: Trainer, task: Task) -> None:
        """Called after testing."""

    def on_test_epoch_start(self, trainer: Trainer, task: Task) -> None:
        """Called at the start of the test epoch."""

    def on_test_epoch_end(self, trainer: Trainer, task: Task) -> None:
        """Called at the end of the test epoch."""

    def on_test_batch_start(
        self, trainer: Trainer, task: Task, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        """Called before test_step."""

    def on_test_batch_end(
        self, trainer: Trainer, task: Task, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        """Called after test_step."""

    def on_predict_start(self, trainer: Trainer, task: Task) -> None:
        """Called before predicting."""

    def on_predict_end(self, trainer: Trainer, task: Task) -> None:
        """Called after predicting."""

    def on_predict_epoch_start(self, trainer: Trainer, task: Task) -> None:
        """Called at the start of the predict epoch."""

    def on_predict_epoch_end(self, trainer: Trainer, task: Task) -> None:
        """Called at the end of the predict epoch."""

    def on_predict_batch_start(
        self, trainer: Trainer, task: Task, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        """Called before predict_step."""

    def on_predict_batch_end(
        self, trainer: Trainer, task: Task, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        """Called after predict_step."""

    def on_before_backward(self, trainer: Trainer, task: Task, loss: torch.Tensor) -> None:
        """Called before backward."""

    def on_after_backward(self, trainer: Trainer, task: Task) -> None:
        """Called after backward."""

    def on_before_optimizer_step(
        self, trainer: Trainer, task: Task, optimizer: torch.optim.Optimizer
    ) -> None:
        """Called with unscaled, reduced gradients before clipping and the step."""

    def on_before_zero_grad(self, trainer: Trainer, task: Task, optimizer: torch.optim.Optimizer) -> None:
        """Called before optimizer.zero_grad()."""

    def on_save_checkpoint(self, trainer: Trainer, task: Task, checkpoint: dict[str, Any]) -> None:
        """Called before a checkpoint is written."""

    def on_load_checkpoint(self, trainer: Trainer, task: Task, checkpoint: dict[str, Any]) -> None:
        """Called after a checkpoint is read."""

    def on_exception(self, trainer: Trainer, task: Task, exception: BaseException) -> None:
        """Called when fit/validate/test/predict raises."""
