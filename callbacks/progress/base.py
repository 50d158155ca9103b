"""ProgressBar: Lightning's base class for progress bars (TQDMProgressBar and RichProgressBar build on it)."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

from callbacks.base import Callback

if TYPE_CHECKING:
    from trainer.task.base import Task
    from trainer.trainer import Trainer


class ProgressBar(Callback):
    """Subclass it for a custom bar: it knows the batch totals of every stage; implement ``disable`` and
    ``enable`` (the Tuner switches the bar off while it runs), and draw in the hooks you need.

    Example::

        class PercentBar(ProgressBar):
            def __init__(self):
                super().__init__(); self.enabled = True
            def disable(self): self.enabled = False
            def enable(self): self.enabled = True
            def on_train_batch_end(self, trainer, task, outputs, batch, batch_idx):
                if self.enabled: print(f"{100 * (batch_idx + 1) / self.total_train_batches:.0f}%")
    """

    def __init__(self) -> None:
        self._trainer: Trainer | None = None
        self._current_eval_dataloader_idx: int | None = None

    @property
    def trainer(self) -> Trainer:
        """The Trainer this bar is attached to (set in setup)."""
        if self._trainer is None:
            raise TypeError(f"The `{type(self).__name__}._trainer` reference has not been set yet.")
        return self._trainer

    sanity_check_description = "Sanity Checking"
    train_description = "Training"
    validation_description = "Validation"
    test_description = "Testing"
    predict_description = "Predicting"

    # ----- totals ---------------------------------------------------------------------------------
    @property
    def total_train_batches(self) -> int | float:
        """Training batches this epoch (fewer when max_steps ends the run first with max_epochs=-1)."""
        t = self.trainer
        if t.max_epochs == -1 and t.max_steps is not None and t.max_steps > 0:
            return min(t.num_training_batches, t.max_steps - t.global_step)
        return t.num_training_batches

    @property
    def num_sanity_val_batches(self) -> list[int | float]:
        """The number of sanity-check batches of each validation loader."""
        steps = self.trainer.config.num_sanity_val_steps
        return [n if steps == -1 else min(n, steps) for n in self.trainer.num_val_batches]

    @property
    def total_val_batches_current_dataloader(self) -> int | float:
        """The number of validation batches of the loader being run."""
        t = self.trainer
        sizes = self.num_sanity_val_batches if t.sanity_checking else t.num_val_batches
        return sizes[self._current_eval_dataloader_idx or 0]

    @property
    def total_test_batches_current_dataloader(self) -> int | float:
        """The number of test batches of the loader being run."""
        return self.trainer.num_test_batches[self._current_eval_dataloader_idx or 0]

    @property
    def total_predict_batches_current_dataloader(self) -> int | float:
        """The number of predict batches of the loader being run."""
        return self.trainer.num_predict_batches[self._current_eval_dataloader_idx or 0]

    @property
    def total_val_batches(self) -> int | float:
        """Validation batches of every loader in this epoch's validation (0 when the epoch validates not)."""
        t = self.trainer
        every = t.config.check_val_every_n_epoch
        if every is not None and (t.current_epoch + 1) % every:
            return 0
        return sum(t.num_val_batches)

    def has_dataloader_changed(self, dataloader_idx: int) -> bool:
        """Whether `dataloader_idx` differs from the loader the bar showed last (and remember it)."""
        old, self._current_eval_dataloader_idx = self._current_eval_dataloader_idx, dataloader_idx
        return old != dataloader_idx

    def reset_dataloader_idx_tracker(self) -> None:
        """Forget which loader the bar showed last."""
        self._current_eval_dataloader_idx = None

    # ----- what a bar implements ------------------------------------------------------------------
    @property
    def is_enabled(self) -> bool:
        """Whether the bar draws (override with your bar's state; the task prints through an enabled bar)."""
        return True

    @property
    def is_disabled(self) -> bool:
        """Whether the bar is off."""
        return not self.is_enabled

    def disable(self) -> None:
        """Stop drawing (called on ranks other than 0, and by the Tuner while it runs)."""
        raise NotImplementedError

    def enable(self) -> None:
        """Draw again."""
        raise NotImplementedError

    def print(self, *args: Any, **kwargs: Any) -> None:
        """Print without breaking the bar."""
        print(*args, **kwargs)

    def setup(self, trainer: Trainer, task: Task, stage: str) -> None:
        self._trainer = trainer
        if not trainer.is_global_zero:
            self.disable()

    def get_metrics(self, trainer: Trainer, task: Task) -> dict[str, Any]:
        """What the bar shows: the logger's version as ``v_num`` and the metrics logged with prog_bar=True.
        Override to change it."""
        standard = get_standard_metrics(trainer)
        shown = trainer.progress_bar_metrics
        both = sorted(standard.keys() & shown.keys())
        if both:
            warnings.warn(
                f"self.log({both[0]!r}, ..., prog_bar=True) overwrites the progress bar's own {both[0]!r}; "
                "rename the metric or override get_metrics() of the bar.",
                UserWarning,
                stacklevel=2,
            )
        return {**standard, **shown}


def get_standard_metrics(trainer: Trainer) -> dict[str, int | str]:
    """``{"v_num": version}`` of the loggers (the last 4 characters of a string version), else empty."""
    versions = list(dict.fromkeys(str(lg.version) for lg in trainer.loggers))
    if not versions:
        return {}
    version: int | str = trainer.loggers[0].version if len(versions) == 1 else "_".join(versions)
    if version in ("", None):
        return {}
    return {"v_num": version[-4:] if isinstance(version, str) else version}
