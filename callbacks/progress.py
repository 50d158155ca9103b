"""ProgressBar: tqdm bars for training and evaluation, drawn by rank 0 only."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any

from callbacks.base import Callback
from trainer.errors import ConfigError

if TYPE_CHECKING:
    from trainer.task.base import Task
    from trainer.trainer import Trainer


def format_metrics(metrics: dict[str, float]) -> dict[str, str]:
    """Three significant digits, as Lightning's bar shows them."""
    return {k: f"{v:.3g}" for k, v in metrics.items()}


class ProgressBar(Callback):
    """A tqdm bar per training epoch (it/s, prog_bar metrics) and one per evaluation run.

    The bar advances every `refresh_rate` batches; the prog_bar metrics are converted to numbers (a device
    synchronization) only on those batches and at most once per `min_interval_s`, so a step that draws
    nothing costs no synchronization. Example: ``Trainer(callbacks=[ProgressBar(refresh_rate=10)])``.
    """

    # runs after the task's hooks, so that the epoch-end bar shows the epoch's aggregates
    monitoring = True

    def __init__(self, refresh_rate: int = 1, leave: bool = False, min_interval_s: float = 0.1) -> None:
        if not isinstance(refresh_rate, int) or refresh_rate < 1:
            raise ConfigError(f"ProgressBar(refresh_rate=...) must be an int >= 1, got {refresh_rate!r}.")
        self.refresh_rate = refresh_rate
        self.leave = leave
        self.min_interval_s = min_interval_s
        self.train_bar: Any = None
        self.eval_bar: Any = None
        self._eval_count = 0
        self._last_metrics_t = float("-inf")

    def _new_bar(
        self, desc: str, total: int | float | None, position: int, leave: bool, initial: int = 0
    ) -> Any:
        from tqdm import tqdm  # imported when a bar is drawn: `import trainer` stays fast

        return tqdm(
            desc=desc,
            total=None if total is None or total == float("inf") else int(total),
            initial=initial,
            position=position,
            leave=leave,
            dynamic_ncols=True,
            file=sys.stdout,
            smoothing=0,
            mininterval=self.min_interval_s,
        )

    def _set_metrics(self, trainer: Trainer, bar: Any, force: bool = False) -> None:
        """Show the prog_bar metrics; converts them, so only when it is time to draw."""
        now = time.monotonic()
        if force or now - self._last_metrics_t >= self.min_interval_s:
            self._last_metrics_t = now
            bar.set_postfix(format_metrics(trainer.progress_bar_metrics), refresh=False)

    # ----- training ------------------------------------------------------------------------------
    def on_train_epoch_start(self, trainer: Trainer, task: Task) -> None:
        """Open (or reset) the epoch's bar."""
        if not trainer.is_global_zero:
            return
        total, start = trainer.num_training_batches, trainer.state.batch_in_epoch
        desc = f"Epoch {trainer.current_epoch}"
        if self.train_bar is None or self.leave:
            self._close_train()
            self.train_bar = self._new_bar(desc, total, 0, leave=True, initial=start)
        else:
            self.train_bar.set_description(desc, refresh=False)
            self.train_bar.reset(total=None if total == float("inf") else int(total))
            self.train_bar.update(start)

    def on_train_batch_end(
        self, trainer: Trainer, task: Task, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Advance every refresh_rate batches."""
        bar = self.train_bar
        if bar is None:
            return
        done = batch_idx + 1
        if done % self.refresh_rate == 0 or done == bar.total:
            self._set_metrics(trainer, bar)
            bar.update(done - bar.n)

    def on_train_epoch_end(self, trainer: Trainer, task: Task) -> None:
        """Show the epoch's final metrics."""
        if self.train_bar is not None:
            self._set_metrics(trainer, self.train_bar, force=True)
            self.train_bar.refresh()
            if self.leave:
                self._close_train()

    def on_train_end(self, trainer: Trainer, task: Task) -> None:
        """Close the bar."""
        self._close_train()

    # ----- evaluation ----------------------------------------------------------------------------
    def _eval_start(
        self, trainer: Trainer, desc: str, sizes: list[int | float], limit: int | None = None
    ) -> None:
        if not trainer.is_global_zero:
            return
        self._close_eval()
        total = sum(n if limit is None else min(n, limit) for n in sizes)
        standalone = trainer.state.stage != "fit"
        self._eval_count = 0
        self.eval_bar = self._new_bar(desc, total, 1 if self.train_bar is not None else 0, leave=standalone)

    def _eval_batch_end(self) -> None:
        self._eval_count += 1
        if self.eval_bar is not None and self._eval_count % self.refresh_rate == 0:
            self.eval_bar.update(self._eval_count - self.eval_bar.n)

    def _eval_end(self, trainer: Trainer) -> None:
        if self.eval_bar is not None:
            self.eval_bar.update(self._eval_count - self.eval_bar.n)
        self._close_eval()
        if self.train_bar is not None and not trainer.sanity_checking:
            self._set_metrics(trainer, self.train_bar, force=True)  # show the validation metrics
            self.train_bar.refresh()

    def on_validation_start(self, trainer: Trainer, task: Task) -> None:
        """Open the validation (or sanity check) bar."""
        sanity = trainer.sanity_checking
        steps = trainer.config.num_sanity_val_steps
        limit = (None if steps == -1 else steps) if sanity else None
        desc = "Sanity Checking" if sanity else "Validation"
        self._eval_start(trainer, desc, list(trainer.num_val_batches), limit)

    def on_validation_batch_end(self, trainer: Trainer, task: Task, *args: Any) -> None:
        self._eval_batch_end()

    def on_validation_end(self, trainer: Trainer, task: Task) -> None:
        self._eval_end(trainer)

    def on_test_start(self, trainer: Trainer, task: Task) -> None:
        self._eval_start(trainer, "Testing", list(trainer.num_test_batches))

    def on_test_batch_end(self, trainer: Trainer, task: Task, *args: Any) -> None:
        self._eval_batch_end()

    def on_test_end(self, trainer: Trainer, task: Task) -> None:
        self._eval_end(trainer)

    def on_predict_start(self, trainer: Trainer, task: Task) -> None:
        self._eval_start(trainer, "Predicting", list(trainer.num_predict_batches))

    def on_predict_batch_end(self, trainer: Trainer, task: Task, *args: Any) -> None:
        self._eval_batch_end()

    def on_predict_end(self, trainer: Trainer, task: Task) -> None:
        self._eval_end(trainer)

    # ----- clean-up ------------------------------------------------------------------------------
    def _close_train(self) -> None:
        if self.train_bar is not None:
            self.train_bar.close()
            self.train_bar = None

    def _close_eval(self) -> None:
        if self.eval_bar is not None:
            self.eval_bar.close()
            self.eval_bar = None

    def on_exception(self, trainer: Trainer, task: Task, exception: BaseException) -> None:
        """Close the bars so that the traceback starts on a clean line."""
        self._close_eval()
        self._close_train()

    def teardown(self, trainer: Trainer, task: Task, stage: str) -> None:
        self._close_eval()
        self._close_train()
