"""RichProgressBar: the progress bars drawn with `rich` (the optional extra ``tandem-trainer[rich]``)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from callbacks.progress.base import ProgressBar
from callbacks.progress.rich_columns import columns
from tandem_core.errors import require

if TYPE_CHECKING:
    from trainer.task.base import Task
    from trainer.trainer import Trainer


@dataclass
class RichProgressBarTheme:
    """Styles of the bar's parts (rich style strings), as Lightning's theme."""

    description: str = ""
    progress_bar: str = "#6206E0"
    progress_bar_finished: str = "#6206E0"
    progress_bar_pulse: str = "#6206E0"
    batch_progress: str = ""
    time: str = "dim"
    processing_speed: str = "dim underline"
    metrics: str = "italic"
    metrics_text_delimiter: str = " "
    metrics_format: str = ".3f"


class RichProgressBar(ProgressBar):
    """Progress bars drawn with rich: one for training (with the prog_bar metrics), one per evaluation loader.

    Lightning's arguments: `refresh_rate` redraws per second (0 draws nothing; the metrics are converted to
    numbers, a device synchronization, at most that often), `leave` keeps each epoch's bar, `theme` the
    styles, `console_kwargs` the ``rich.console.Console`` arguments (``file=``, ``width=``, ...).
    Example: ``Trainer(callbacks=[RichProgressBar(leave=True)])``.
    """

    monitoring = True  # after the task's hooks: the epoch-end bar shows the epoch's aggregates

    def __init__(
        self,
        refresh_rate: int = 100,
        leave: bool = False,
        theme: RichProgressBarTheme | None = None,
        console_kwargs: dict[str, Any] | None = None,
    ) -> None:
        require("rich", "RichProgressBar", "rich")
        super().__init__()
        self._refresh_rate = refresh_rate
        self._leave = leave
        self.theme = theme if theme is not None else RichProgressBarTheme()
        self._console_kwargs = console_kwargs or {}
        self._enabled = True
        self._console: Any = None
        self.progress: Any = None  # rich's Progress of the running (or last) stage
        self._stopped = True
        self._metrics: dict[str, Any] = {}
        self._metrics_t = float("-inf")
        self._reset_ids()

    def _reset_ids(self) -> None:
        self.train_progress_bar_id: Any = None
        self.val_sanity_progress_bar_id: Any = None
        self.val_progress_bar_id: Any = None
        self.test_progress_bar_id: Any = None
        self.predict_progress_bar_id: Any = None

    @property
    def refresh_rate(self) -> int:
        """How many batches pass between two redraws."""
        return self._refresh_rate

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

    def __getstate__(self) -> dict[str, Any]:  # a live display holds a thread and a file
        return {**vars(self), "progress": None, "_console": None}

    def metrics_texts(self) -> list[str]:
        """The metrics shown beside the bar, as text (Lightning's name)."""
        out = []
        for name, value in self._metrics.items():
            try:
                shown = value if isinstance(value, str) else f"{value:{self.theme.metrics_format}}"
            except (TypeError, ValueError):
                shown = str(value)
            out.append(f"{name}: {shown}")
        return out

    # ----- the display -----------------------------------------------------------------------------
    def _start(self) -> None:
        if self.is_disabled or (self.progress is not None and not self._stopped):
            return
        from rich.console import Console
        from rich.progress import Progress

        self._reset_ids()
        self._console = Console(**self._console_kwargs)
        self.progress = Progress(
            *columns(self), auto_refresh=True, refresh_per_second=self.refresh_rate, console=self._console
        )
        self.progress.start()
        self._stopped = False

    def _stop(self) -> None:
        """Stop drawing; the stopped display stays readable (``progress.tasks``) until the next stage starts one."""
        if self.progress is not None and not self._stopped:
            self.progress.stop()
        self._stopped = True

    def _add(self, total: int | float, description: str) -> Any:
        desc = f"[{self.theme.description}]{description}" if self.theme.description else description
        return self.progress.add_task(desc, total=total if math.isfinite(total) else None)

    def _hide(self, task_id: Any) -> None:
        if self.progress is not None and not self._stopped and task_id is not None:
            self.progress.update(task_id, visible=False)

    def _advance(self, task_id: Any, completed: int) -> None:
        if self.progress is not None and not self._stopped and task_id is not None and self.is_enabled:
            self.progress.update(task_id, completed=completed)

    def _update_metrics(self, trainer: Trainer, force: bool = False) -> None:
        now = time.monotonic()
        if self.is_enabled and (force or now - self._metrics_t >= 1.0 / self.refresh_rate):
            self._metrics_t = now
            assert trainer.task is not None
            self._metrics = self.get_metrics(trainer, trainer.task)

    def _train_description(self, epoch: int) -> str:
        desc = f"Epoch {epoch}" + (f"/{self.trainer.max_epochs - 1}" if self.trainer.max_epochs != -1 else "")
        return f"{desc:{len(self.validation_description)}}"  # as wide as "Validation": no flicker

    # ----- hooks ---------------------------------------------------------------------------------
    def on_sanity_check_start(self, trainer: Trainer, task: Task) -> None:
        self._start()

    def on_sanity_check_end(self, trainer: Trainer, task: Task) -> None:
        self._hide(self.val_sanity_progress_bar_id)

    def on_train_start(self, trainer: Trainer, task: Task) -> None:
        self._start()
        if trainer.state.batch_in_epoch:  # resumed inside an epoch: no on_train_epoch_start (as Lightning)
            self.on_train_epoch_start(trainer, task)

    def on_train_epoch_start(self, trainer: Trainer, task: Task) -> None:
        if self.is_disabled:
            return
        if self.train_progress_bar_id is not None and self._leave:
            self._stop()  # the finished epoch's bar stays printed; a new display for the next one
        self._start()
        total, desc = self.total_train_batches, self._train_description(trainer.current_epoch)
        if self.train_progress_bar_id is None:
            self.train_progress_bar_id = self._add(total, desc)
        else:
            self.progress.reset(
                self.train_progress_bar_id, total=total if math.isfinite(total) else None, description=desc
            )
        if trainer.state.batch_in_epoch:  # resumed inside the epoch (else the reset bar is at 0 already)
            self._advance(self.train_progress_bar_id, trainer.state.batch_in_epoch)

    def on_train_batch_end(
        self, trainer: Trainer, task: Task, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._update_metrics(trainer)
        self._advance(self.train_progress_bar_id, batch_idx + 1)

    def on_train_epoch_end(self, trainer: Trainer, task: Task) -> None:
        self._update_metrics(trainer, force=True)
        if self.progress is not None and not self._stopped:
            self.progress.refresh()

    def _eval_batch_start(self, kind: str, dataloader_idx: int) -> None:
        if self.is_disabled or not self.has_dataloader_changed(dataloader_idx):
            return
        self._start()
        attr = f"{kind}_progress_bar_id"
        self._hide(getattr(self, attr))
        if kind in ("val_sanity", "val"):
            total = self.total_val_batches_current_dataloader
            desc = self.sanity_check_description if kind == "val_sanity" else self.validation_description
        elif kind == "test":
            total, desc = self.total_test_batches_current_dataloader, self.test_description
        else:
            total, desc = self.total_predict_batches_current_dataloader, self.predict_description
        setattr(self, attr, self._add(total, desc))

    def on_validation_batch_start(self, trainer: Trainer, task: Task, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:  # fmt: skip
        self._eval_batch_start("val_sanity" if trainer.sanity_checking else "val", dataloader_idx)

    def on_validation_batch_end(self, trainer: Trainer, task: Task, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:  # fmt: skip
        bar = self.val_sanity_progress_bar_id if trainer.sanity_checking else self.val_progress_bar_id
        self._advance(bar, batch_idx + 1)

    def on_validation_end(self, trainer: Trainer, task: Task) -> None:
        if trainer.state.entry == "fit":  # the sanity check's end included, as Lightning
            if not trainer.sanity_checking:
                self._hide(self.val_progress_bar_id)
            self._update_metrics(trainer, force=True)
        self.reset_dataloader_idx_tracker()

    def on_test_batch_start(self, trainer: Trainer, task: Task, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:  # fmt: skip
        self._eval_batch_start("test", dataloader_idx)

    def on_test_batch_end(self, trainer: Trainer, task: Task, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:  # fmt: skip
        self._advance(self.test_progress_bar_id, batch_idx + 1)

    def on_test_end(self, trainer: Trainer, task: Task) -> None:
        self.reset_dataloader_idx_tracker()

    def on_predict_batch_start(self, trainer: Trainer, task: Task, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:  # fmt: skip
        self._eval_batch_start("predict", dataloader_idx)

    def on_predict_batch_end(self, trainer: Trainer, task: Task, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:  # fmt: skip
        self._advance(self.predict_progress_bar_id, batch_idx + 1)

    def on_predict_end(self, trainer: Trainer, task: Task) -> None:
        self.reset_dataloader_idx_tracker()

    def print(self, *args: Any, **kwargs: Any) -> None:
        """Print above the live bars."""
        if self._console is None:
            print(*args, **kwargs)
        else:
            self._console.print(*args, **kwargs)

    def on_exception(self, trainer: Trainer, task: Task, exception: BaseException) -> None:
        self._stop()

    def teardown(self, trainer: Trainer, task: Task, stage: str) -> None:
        self._stop()
