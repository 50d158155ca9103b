"""TQDMProgressBar: tqdm bars for training and evaluation, drawn by rank 0 only (the Trainer's default bar)."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any

from callbacks.progress.base import ProgressBar
from tandem_core.errors import ConfigError

if TYPE_CHECKING:
    from trainer.task.base import Task
    from trainer.trainer import Trainer


def format_metrics(metrics: dict[str, Any]) -> dict[str, str]:
    """Three significant digits for numbers, as Lightning's bar shows them; anything else as text."""
    return {k: f"{v:.3g}" if isinstance(v, float) else str(v) for k, v in metrics.items()}


class TQDMProgressBar(ProgressBar):
    """A tqdm bar per training epoch (it/s, prog_bar metrics) and one per evaluation run.

    Lightning's arguments: the bar advances every `refresh_rate` batches (0 draws nothing),
    `process_position` offsets the bars by that many lines, `leave` keeps each epoch's bar. Tandem adds
    `min_interval_s`: the prog_bar metrics are converted to numbers (a device synchronization) only on
    drawing batches and at most once per `min_interval_s`, so a step that draws nothing costs no
    synchronization. Customize a bar by overriding ``init_train_tqdm`` (or the sanity, validation, test,
    predict ones). Example: ``Trainer(callbacks=[TQDMProgressBar(refresh_rate=10)])``.
    """

    # runs after the task's hooks, so that the epoch-end bar shows the epoch's aggregates
    monitoring = True

    def __init__(
        self,
        refresh_rate: int = 1,
        process_position: int = 0,
        leave: bool = False,
        *,
        min_interval_s: float = 0.1,
    ) -> None:
        super().__init__()
        if not isinstance(refresh_rate, int) or isinstance(refresh_rate, bool) or refresh_rate < 0:
            raise ConfigError(f"TQDMProgressBar(refresh_rate=...) must be an int >= 0, got {refresh_rate!r}.")
        self._refresh_rate = refresh_rate
        self._process_position = process_position
        self._leave = leave
        self._enabled = True
        self.min_interval_s = min_interval_s
        self.train_progress_bar: Any = None
        self.val_progress_bar: Any = None  # the open evaluation bar (validation, test or predict)
        self._eval_count = 0
        self._last_metrics_t = float("-inf")
        self._train_rate = refresh_rate

    @property
    def refresh_rate(self) -> int:
        """How many batches pass between two redraws."""
        return self._refresh_rate

    @property
    def process_position(self) -> int:
        """The bar's line offset (for several processes printing bars)."""
        return self._process_position

    @property
    def leave(self) -> bool:
        """Whether each epoch's bar stays on screen when it ends."""
        return self._leave

    @property
    def is_enabled(self) -> bool:
        """Whether the bar draws."""
        return self._enabled and self.refresh_rate > 0

    @property
    def is_disabled(self) -> bool:
        """Whether the bar is off."""
        return not self.is_enabled

    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    def __getstate__(self) -> dict[str, Any]:  # open bars hold a file: pickle without them
        return {k: None if k.endswith("progress_bar") else v for k, v in vars(self).items()}

    # ----- the bars (override to customize) -------------------------------------------------------
    def _tqdm(self, desc: str, position: int, leave: bool) -> Any:
        from tqdm import tqdm  # imported when a bar is drawn: `import trainer` stays fast

        return tqdm(
            desc=desc,
            position=2 * self.process_position + position,
            disable=self.is_disabled,
            leave=leave,
            dynamic_ncols=True,
            file=sys.stdout,
            smoothing=0,
            mininterval=self.min_interval_s,
        )

    def init_sanity_tqdm(self) -> Any:
        """The tqdm bar of the sanity check."""
        return self._tqdm(self.sanity_check_description, 0, False)

    def init_train_tqdm(self) -> Any:
        """The tqdm bar of training."""
        return self._tqdm(self.train_description, 0, True)

    def init_validation_tqdm(self) -> Any:
        """The tqdm bar of validation."""
        return self._tqdm(self.validation_description, 0 if self.train_progress_bar is None else 1, False)

    def init_test_tqdm(self) -> Any:
        """The tqdm bar of testing."""
        return self._tqdm(self.test_description, 0, True)

    def init_predict_tqdm(self) -> Any:
        """The tqdm bar of predicting."""
        return self._tqdm(self.predict_description, 0, True)

    def _set_metrics(self, trainer: Trainer, bar: Any, force: bool = False) -> None:
        """Show the bar's metrics; converts them, so only when it is time to draw."""
        now = time.monotonic()
        if force or now - self._last_metrics_t >= self.min_interval_s:
            self._last_metrics_t = now
            assert trainer.task is not None
            bar.set_postfix(format_metrics(self.get_metrics(trainer, trainer.task)), refresh=False)

    # ----- training ------------------------------------------------------------------------------
    def on_train_start(self, trainer: Trainer, task: Task) -> None:
        """A run resumed inside an epoch gets no on_train_epoch_start (as in Lightning): open its bar here."""
        if trainer.state.batch_in_epoch:
            self.on_train_epoch_start(trainer, task)

    def on_train_epoch_start(self, trainer: Trainer, task: Task) -> None:
        """Open (or reset) the epoch's bar."""
        if self.is_disabled:
            return
        self._train_rate = self.refresh_rate  # read once per epoch (is_enabled: it is > 0)
        total, start = self.total_train_batches, trainer.state.batch_in_epoch
        if self.train_progress_bar is None or self.leave:
            self._close_train()
            self.train_progress_bar = self.init_train_tqdm()
        bar = self.train_progress_bar
        bar.reset(total=None if total == float("inf") else int(total))
        bar.update(start)
        bar.set_description(f"Epoch {trainer.current_epoch}", refresh=False)

    def on_train_batch_end(
        self, trainer: Trainer, task: Task, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Advance every refresh_rate batches."""
        bar = self.train_progress_bar
        if bar is None or not self._enabled:  # (is_enabled was read when the epoch's bar opened)
            return
        done = batch_idx + 1
        if done != bar.total:
            if done % self._train_rate:
                return
            # tqdm's update draws only `mininterval` after its last draw: before that, count without the call
            # (and without converting the metrics, which only a draw shows)
            drawn = getattr(bar, "last_print_t", None)
            if drawn is not None and time.time() - drawn < bar.mininterval:
                bar.n = done
                return
        self._set_metrics(trainer, bar)
        bar.update(done - bar.n)

    def on_train_epoch_end(self, trainer: Trainer, task: Task) -> None:
        """Show the epoch's final metrics."""
        if self.train_progress_bar is not None and self.is_enabled:
            self._set_metrics(trainer, self.train_progress_bar, force=True)
            self.train_progress_bar.refresh()
            if self.leave:
                self._close_train()

    def on_train_end(self, trainer: Trainer, task: Task) -> None:
        """Close the bar."""
        self._close_train()

    # ----- evaluation ----------------------------------------------------------------------------
    def _eval_start(self, bar: Any, total: int | float) -> None:
        self._close_eval()
        self._eval_count = 0
        bar.reset(total=None if total == float("inf") else int(total))
        self.val_progress_bar = bar

    def _eval_batch_end(self) -> None:
        self._eval_count += 1
        bar = self.val_progress_bar
        if bar is not None and self.is_enabled and self._eval_count % self.refresh_rate == 0:
            bar.update(self._eval_count - bar.n)

    def _eval_end(self, trainer: Trainer) -> None:
        bar = self.val_progress_bar
        if bar is not None and self.is_enabled:
            bar.update(self._eval_count - bar.n)
        self._close_eval()
        self.reset_dataloader_idx_tracker()
        if self.train_progress_bar is not None and self.is_enabled and not trainer.sanity_checking:
            self._set_metrics(trainer, self.train_progress_bar, force=True)  # show the validation metrics
            self.train_progress_bar.refresh()

    def on_sanity_check_start(self, trainer: Trainer, task: Task) -> None:
        self._eval_start(self.init_sanity_tqdm(), sum(self.num_sanity_val_batches))

    def on_sanity_check_end(self, trainer: Trainer, task: Task) -> None:
        self._close_eval()

    def on_validation_start(self, trainer: Trainer, task: Task) -> None:
        """Open the validation bar (the sanity check opened its own)."""
        if not trainer.sanity_checking:
            self._eval_start(self.init_validation_tqdm(), sum(trainer.num_val_batches))

    def on_validation_batch_end(self, trainer: Trainer, task: Task, *args: Any) -> None:
        self._eval_batch_end()

    def on_validation_end(self, trainer: Trainer, task: Task) -> None:
        self._eval_end(trainer)

    def on_test_start(self, trainer: Trainer, task: Task) -> None:
        self._eval_start(self.init_test_tqdm(), sum(trainer.num_test_batches))

    def on_test_batch_end(self, trainer: Trainer, task: Task, *args: Any) -> None:
        self._eval_batch_end()

    def on_test_end(self, trainer: Trainer, task: Task) -> None:
        self._eval_end(trainer)

    def on_predict_start(self, trainer: Trainer, task: Task) -> None:
        self._eval_start(self.init_predict_tqdm(), sum(trainer.num_predict_batches))

    def on_predict_batch_end(self, trainer: Trainer, task: Task, *args: Any) -> None:
        self._eval_batch_end()

    def on_predict_end(self, trainer: Trainer, task: Task) -> None:
        self._eval_end(trainer)

    def print(self, *args: Any, **kwargs: Any) -> None:
        """Print above the bars."""
        bar = self.val_progress_bar or self.train_progress_bar
        if bar is None:
            print(*args, **kwargs)
            return
        from tqdm import tqdm

        sep, end = kwargs.pop("sep", " "), kwargs.pop("end", "\n")
        tqdm.write(sep.join(map(str, args)), end=end, file=kwargs.pop("file", sys.stdout))

    # ----- clean-up ------------------------------------------------------------------------------
    def _close_train(self) -> None:
        if self.train_progress_bar is not None:
            self.train_progress_bar.close()
            self.train_progress_bar = None

    def _close_eval(self) -> None:
        if self.val_progress_bar is not None:
            self.val_progress_bar.close()
            self.val_progress_bar = None

    def on_exception(self, trainer: Trainer, task: Task, exception: BaseException) -> None:
        """Close the bars so that the traceback starts on a clean line."""
        self._close_eval()
        self._close_train()

    def teardown(self, trainer: Trainer, task: Task, stage: str) -> None:
        self._close_eval()
        self._close_train()
