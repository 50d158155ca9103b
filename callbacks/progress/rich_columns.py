"""The columns of RichProgressBar under Lightning's names (``BatchesProcessedColumn``, ...), built on first use
because rich is an optional extra; ``columns(bar)`` looks them up here each time a display starts, so a subclass
or a test may replace one in this module."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from callbacks.progress.rich_bar import RichProgressBar

_NAMES = (
    "CustomBarColumn",
    "BatchesProcessedColumn",
    "CustomTimeColumn",
    "ProcessingSpeedColumn",
    "MetricsTextColumn",
)


def _build() -> dict[str, type]:
    from rich.progress import BarColumn, ProgressColumn
    from rich.text import Text

    class CustomBarColumn(BarColumn):
        """The bar itself (rich's BarColumn; styles from the theme)."""

    class _Styled(ProgressColumn):
        def __init__(self, style: Any = "") -> None:
            super().__init__()
            self.style = style

    class BatchesProcessedColumn(_Styled):
        """``done/total`` batches (``--`` for an unknown total)."""

        def render(self, task: Any) -> Text:
            total = "--" if task.total is None or not math.isfinite(task.total) else int(task.total)
            return Text(f"{int(task.completed)}/{total}", style=self.style)

    class CustomTimeColumn(_Styled):
        """``elapsed • remaining``."""

        max_refresh = 0.5

        def render(self, task: Any) -> Text:
            elapsed = task.finished_time if task.finished else task.elapsed
            remaining = None if task.total is None or not math.isfinite(task.total) else task.time_remaining
            shown = [
                ("-:--:--" if s is None else str(timedelta(seconds=int(s)))) for s in (elapsed, remaining)
            ]
            return Text(" • ".join(shown), style=self.style)

    class ProcessingSpeedColumn(_Styled):
        """Batches per second."""

        def render(self, task: Any) -> Text:
            return Text(f"{task.speed or 0.0:>.2f}it/s", style=self.style)

    class MetricsTextColumn(ProgressColumn):
        """The bar's metrics, beside the training bar only."""

        def __init__(self, bar: RichProgressBar, style: Any = "", text_delimiter: str = " ") -> None:
            super().__init__()
            self.bar, self.style, self.text_delimiter = bar, style, text_delimiter

        def render(self, task: Any) -> Text:
            if task.id != self.bar.train_progress_bar_id:
                return Text()
            return Text(self.text_delimiter.join(self.bar.metrics_texts()), style=self.style)

    return {
        "CustomBarColumn": CustomBarColumn,
        "BatchesProcessedColumn": BatchesProcessedColumn,
        "CustomTimeColumn": CustomTimeColumn,
        "ProcessingSpeedColumn": ProcessingSpeedColumn,
        "MetricsTextColumn": MetricsTextColumn,
    }


def __getattr__(name: str) -> Any:
    """The column classes, made when first asked for (importing rich is left to the first rich bar)."""
    if name in _NAMES:
        for key, cls in _build().items():
            globals().setdefault(key, cls)  # a class put here already (a replacement) stays
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _cls(name: str) -> Any:
    return globals().get(name) or __getattr__(name)


def columns(bar: RichProgressBar) -> list[Any]:
    """Description, bar, batches done/total, elapsed • remaining, speed, and the training metrics."""
    from rich.progress import TextColumn

    theme = bar.theme
    return [
        TextColumn("[progress.description]{task.description}"),
        _cls("CustomBarColumn")(
            complete_style=theme.progress_bar,
            finished_style=theme.progress_bar_finished,
            pulse_style=theme.progress_bar_pulse,
        ),
        _cls("BatchesProcessedColumn")(style=theme.batch_progress),
        _cls("CustomTimeColumn")(style=theme.time),
        _cls("ProcessingSpeedColumn")(style=theme.processing_speed),
        _cls("MetricsTextColumn")(bar, style=theme.metrics, text_delimiter=theme.metrics_text_delimiter),
    ]
