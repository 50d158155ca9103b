"""TQDMProgressBar: tqdm bars for training and evaluation, drawn by rank 0 only (the Trainer's default bar)."""

from __future__ import annotations

import math
import os
import sys
import time
from typing import TYPE_CHECKING, Any

from callbacks.progress.base import ProgressBar
from tandem_core.errors import ConfigError

if TYPE_CHECKING:
    from callbacks.progress.tqdm_class import Tqdm
    from trainer.task.base import Task
    from trainer.trainer import Trainer


_time = time.time  # tqdm's clock (its last_print_t)


def __getattr__(name: str) -> Any:
    """``Tqdm`` is imported on first use (`import trainer` stays fast); a test may replace it here."""
    if name == "Tqdm":
        from callbacks.progress.tqdm_class import Tqdm

        globals()["Tqdm"] = Tqdm
        return Tqdm
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _bar_class() -> type:
    return globals().get("Tqdm") or __getattr__("Tqdm")


def _finite(total: int | float | None) -> int | float | None:
    """tqdm takes None for an unknown length (an infinite or NaN total)."""
    return None if total is None or math.isinf(total) or math.isnan(total) else total


class TQDMProgressBar(ProgressBar):
    """A tqdm bar for training (one per epoch with ``leave=True``) and one per evaluation run, its
    ``train_progress_bar``, ``val_progress_bar``, ``test_progress_bar`` and ``predict_progress_bar``
    (kept after they close, as Lightning keeps them).

    Lightning's arguments: the bar advances every `refresh_rate` batches (0 draws nothing; the environment
    variable ``TQDM_MINITERS`` raises it), `process_position` offsets the bars by that many lines, `leave` keeps
    each epoch's bar. Tandem adds `min_interval_s`: the prog_bar metrics are converted to numbers (a device
    synchronization) only on drawing batches and at most once per `min_interval_s`, so a step that draws
    nothing costs no synchronization. Customize a bar by overriding ``init_train_tqdm`` (or the sanity,
    validation, test, predict ones). Example: ``Trainer(callbacks=[TQDMProgressBar(refresh_rate=10)])``.
    """

    BAR_FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_noinv_fmt}{postfix}]"
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
        if os.getenv("COLAB_GPU") and refresh_rate == 1:  # a bar redrawn every batch crashes Colab's output
            refresh_rate = 20
        if "TQDM_MINITERS" in os.environ:  # tqdm's own setting of the fewest iterations between draws
            refresh_rate = max(refresh_rate, int(os.environ["TQDM_MINITERS"]))
        self._refresh_rate = refresh_rate
        self._process_position = process_position
        self._leave = leave
        self._enabled = True
        self.min_interval_s = min_interval_s
        self._bars: dict[str, Any] = {"train": None, "val": None, "test": None, "predict": None}
        self._last_metrics_t = float("-inf")
        self._train_rate = 0  # the training bar's refresh rate this epoch (0: it draws nothing)

    # ----- the bars, as Lightning names them -------------------------------------------------------
    def _get(self, kind: str) -> Any:
        bar = self._bars[kind]
        if bar is None:
            raise TypeError(f"{type(self).__name__}.{kind}_progress_bar has not been opened yet.")
        return bar

    @property
    def train_progress_bar(self) -> Tqdm:
        """The training bar (a TypeError before training opened one)."""
        return self._get("train")

    @train_progress_bar.setter
    def train_progress_bar(self, bar: Any) -> None:
        self._bars["train"] = bar

    @property
    def val_progress_bar(self) -> Tqdm:
        """The validation (or sanity check) bar."""
        return self._get("val")

    @val_progress_bar.setter
    def val_progress_bar(self, bar: Any) -> None:
        self._bars["val"] = bar

    @property
    def test_progress_bar(self) -> Tqdm:
        """The test bar."""
        return self._get("test")

    @test_progress_bar.setter
    def test_progress_bar(self, bar: Any) -> None:
        self._bars["test"] = bar

    @property
    def predict_progress_bar(self) -> Tqdm:
        """The predict bar."""
        return self._get("predict")

    @predict_progress_bar.setter
    def predict_progress_bar(self, bar: Any) -> None:
        self._bars["predict"] = bar

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
        self._train_rate = 0

    def enable(self) -> None:
        self._enabled = True
        self._train_rate = self.refresh_rate if self.is_enabled else 0

    def __getstate__(self) -> dict[str, Any]:  # open bars hold a file: pickle without them
        state = dict(vars(self))
        state["_bars"] = dict.fromkeys(self._bars)
        return state

    # ----- making bars (override to customize) ----------------------------------------------------
    def _tqdm(self, desc: str, line: int, leave: bool, smoothing: bool = False) -> Any:
        extra = {"smoothing": 0} if smoothing else {}
        return _bar_class()(
            desc=desc,
            position=2 * self.process_position + line,
            disable=self.is_disabled,
            leave=leave,
            dynamic_ncols=True,
            file=sys.stdout,
            mininterval=self.min_interval_s,
            bar_format=self.BAR_FORMAT,
            **extra,
        )

    def init_sanity_tqdm(self) -> Tqdm:
        """The tqdm bar of the sanity check."""
        return self._tqdm(self.sanity_check_description, 0, False)

    def init_train_tqdm(self) -> Tqdm:
        """The tqdm bar of training."""
        return self._tqdm(self.train_description, 0, True, smoothing=True)

    def init_validation_tqdm(self) -> Tqdm:
        """The tqdm bar of validation (under the training bar during fit)."""
        under_train = self.trainer.state.fn != "validate"
        return self._tqdm(self.validation_description, int(under_train), not under_train)

    def init_test_tqdm(self) -> Tqdm:
        """The tqdm bar of testing."""
        return self._tqdm(self.test_description, 0, True)

    def init_predict_tqdm(self) -> Tqdm:
        """The tqdm bar of predicting."""
        return self._tqdm(self.predict_description, 0, True, smoothing=True)

    # ----- drawing ---------------------------------------------------------------------------------
    def _due(self, n: int, total: Any) -> bool:
        return self.is_enabled and (n % self.refresh_rate == 0 or n == total)

    def _advance(self, bar: Any, n: int) -> None:
        """Set the count (exact after every drawing batch, as Lightning's); redraw unless tqdm drew just now."""
        if bar.disable:
            return
        bar.n = n
        drawn, now = getattr(bar, "last_print_t", None), _time()
        if n == bar.total or drawn is None or now - drawn >= getattr(bar, "mininterval", 0):
            bar.refresh()
            if drawn is not None:  # tqdm's refresh() draws without noting when; its update() notes it
                bar.last_print_t, bar.last_print_n = now, n

    def _show_metrics(self, trainer: Trainer, force: bool = False, even_hidden: bool = False) -> None:
        """Put the metrics on the training bar; converts them, so only when it is time to draw (and, as in
        Lightning, at the end of each validation of fit, the sanity check's included)."""
        bar = self._bars["train"]
        if bar is None or (bar.disable and not even_hidden):
            return
        now = time.monotonic()
        if force or now - self._last_metrics_t >= self.min_interval_s:
            self._last_metrics_t = now
            assert trainer.task is not None
            # numbers stay numbers: the bar class formats them (Tqdm pads them to a steady width)
            bar.set_postfix(self.get_metrics(trainer, trainer.task), refresh=force)

    def _loader_start(self, kind: str, total: Any, desc: str, dataloader_idx: int) -> None:
        """A new evaluation loader: restart the bar at 0 of its length."""
        if not self.has_dataloader_changed(dataloader_idx):
            return
        bar = self._bars[kind]
        if bar is None:
            return
        bar.reset()
        bar.total = _finite(total)
        bar.initial = 0
        bar.set_description(f"{desc} DataLoader {dataloader_idx}")

    def _batch_end(self, kind: str, batch_idx: int) -> None:
        bar = self._bars[kind]
        if bar is not None and self._due(batch_idx + 1, bar.total):
            self._advance(bar, batch_idx + 1)

    def _close(self, kind: str) -> None:
        if self._bars[kind] is not None:
            self._bars[kind].close()

    # ----- training ------------------------------------------------------------------------------
    def on_sanity_check_start(self, trainer: Trainer, task: Task) -> None:
        self.val_progress_bar = self.init_sanity_tqdm()
        self.train_progress_bar = _bar_class()(disable=True)  # no training bar yet

    def on_sanity_check_end(self, trainer: Trainer, task: Task) -> None:
        self._close("val")
        self._close("train")

    def on_train_start(self, trainer: Trainer, task: Task) -> None:
        """Open the training bar; a run resumed inside an epoch gets no on_train_epoch_start (as in Lightning)."""
        self.train_progress_bar = self.init_train_tqdm()
        if trainer.state.batch_in_epoch:
            self.on_train_epoch_start(trainer, task)

    def on_train_epoch_start(self, trainer: Trainer, task: Task) -> None:
        """Restart the bar (a new one with ``leave=True``) at the epoch's first batch."""
        if self.leave and trainer.state.batch_in_epoch == 0:
            self.train_progress_bar = self.init_train_tqdm()
        bar = self.train_progress_bar
        self._train_rate = self.refresh_rate if self.is_enabled else 0  # (read once per epoch)
        bar.reset()
        bar.total = _finite(self.total_train_batches)
        bar.initial = 0
        bar.set_description(f"Epoch {trainer.current_epoch}")
        if trainer.state.batch_in_epoch:
            self._advance(bar, trainer.state.batch_in_epoch)

    def on_train_batch_end(
        self, trainer: Trainer, task: Task, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Advance every refresh_rate batches (and on the last one). Less than `min_interval_s` after the metrics
        were last shown the batch only sets the count: no metric is converted, no redraw is considered, and the
        step pays a clock read and a few attribute reads."""
        bar, n, rate = self._bars["train"], batch_idx + 1, self._train_rate
        if bar is None or not rate:
            return
        if n != bar.total:
            if n % rate:
                return
            if time.monotonic() - self._last_metrics_t < self.min_interval_s:
                bar.n = n
                return
        self._show_metrics(trainer, force=n == bar.total)
        self._advance(bar, n)

    def on_train_epoch_end(self, trainer: Trainer, task: Task) -> None:
        """Show the epoch's final metrics."""
        self._show_metrics(trainer, force=True)
        if self.leave:
            self._close("train")

    def on_train_end(self, trainer: Trainer, task: Task) -> None:
        """Close the bar (it stays readable as train_progress_bar)."""
        self._close("train")

    # ----- evaluation ----------------------------------------------------------------------------
    def on_validation_start(self, trainer: Trainer, task: Task) -> None:
        """Open the validation bar (the sanity check opened its own)."""
        if not trainer.sanity_checking:
            self.val_progress_bar = self.init_validation_tqdm()

    def on_validation_batch_start(
        self, trainer: Trainer, task: Task, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        desc = self.sanity_check_description if trainer.sanity_checking else self.validation_description
        self._loader_start("val", self.total_val_batches_current_dataloader, desc, dataloader_idx)

    def on_validation_batch_end(
        self, trainer: Trainer, task: Task, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._batch_end("val", batch_idx)

    def on_validation_end(self, trainer: Trainer, task: Task) -> None:
        self._close("val")
        self.reset_dataloader_idx_tracker()
        if trainer.state.fn == "fit":
            self._show_metrics(trainer, force=True, even_hidden=True)  # show the validation metrics

    def on_test_start(self, trainer: Trainer, task: Task) -> None:
        self.test_progress_bar = self.init_test_tqdm()

    def on_test_batch_start(
        self, trainer: Trainer, task: Task, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        total = self.total_test_batches_current_dataloader
        self._loader_start("test", total, self.test_description, dataloader_idx)

    def on_test_batch_end(
        self, trainer: Trainer, task: Task, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._batch_end("test", batch_idx)

    def on_test_end(self, trainer: Trainer, task: Task) -> None:
        self._close("test")
        self.reset_dataloader_idx_tracker()

    def on_predict_start(self, trainer: Trainer, task: Task) -> None:
        self.predict_progress_bar = self.init_predict_tqdm()

    def on_predict_batch_start(
        self, trainer: Trainer, task: Task, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        total = self.total_predict_batches_current_dataloader
        self._loader_start("predict", total, self.predict_description, dataloader_idx)

    def on_predict_batch_end(
        self, trainer: Trainer, task: Task, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._batch_end("predict", batch_idx)

    def on_predict_end(self, trainer: Trainer, task: Task) -> None:
        self._close("predict")
        self.reset_dataloader_idx_tracker()

    def print(self, *args: Any, sep: str = " ", **kwargs: Any) -> None:
        """Print above the bars (through the first drawing bar's ``write``; nothing when none draws)."""
        for bar in self._bars.values():
            if bar is not None and not bar.disable:
                bar.write(sep.join(map(str, args)), **kwargs)
                return

    # ----- clean-up ------------------------------------------------------------------------------
    def on_exception(self, trainer: Trainer, task: Task, exception: BaseException) -> None:
        """Close the bars so that the traceback starts on a clean line."""
        for kind in self._bars:
            self._close(kind)

    def teardown(self, trainer: Trainer, task: Task, stage: str) -> None:
        for kind in self._bars:
            self._close(kind)
