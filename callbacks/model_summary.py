"""ModelSummary: a table of the task's layers (parameters, mode, FLOPs, in/out sizes), printed when fit starts."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from callbacks.base import Callback
from callbacks.summary.table import Summary, format_table
from callbacks.summary.table import summarize as summary_of

if TYPE_CHECKING:
    from trainer.task.base import Task
    from trainer.trainer import Trainer


def summarize(module: torch.nn.Module, max_depth: int = 1) -> str:
    """The summary table of `module` as text (see callbacks/summary/table.py)."""
    return format_table(summary_of(module, max_depth))


class ModelSummary(Callback):
    """Prints the task's layers down to `max_depth` (-1: all; 0: nothing) with their parameter counts, mode
    and, when the task sets ``example_input_array``, their FLOPs and input/output sizes; then the totals.

    Added by the Trainer unless ``enable_model_summary=False``. Example: ``ModelSummary(max_depth=2)``.
    `summarize_kwargs` reach ``summarize()`` (RichModelSummary takes ``header_style``).
    """

    def __init__(self, max_depth: int = 1, **summarize_kwargs: Any) -> None:
        self._max_depth = max_depth
        self._summarize_kwargs = summarize_kwargs

    @property
    def max_depth(self) -> int:
        """How deep into nested modules the summary goes (-1: all, 0: no summary)."""
        return self._max_depth

    def on_fit_start(self, trainer: Trainer, task: Task) -> None:
        """Every rank computes it (the example forward may need every rank, e.g. under FSDP); rank 0 prints."""
        if not self._max_depth:
            return
        s = self._summary(trainer, task)
        if trainer.is_global_zero:
            self.summarize(
                s.columns, s.total_parameters, s.trainable_parameters, s.model_size, s.total_training_modes,
                total_flops=s.total_flops, **self._summarize_kwargs,
            )  # fmt: skip

    def _summary(self, trainer: Trainer, task: Task) -> Summary:
        bits = 64 if str(trainer.precision).startswith("64") else 32  # mixed precision keeps fp32 weights
        return summary_of(task, self._max_depth, bits)

    @staticmethod
    def summarize(
        summary_data: list[tuple[str, list[str]]],
        total_parameters: int,
        trainable_parameters: int,
        model_size: float,
        total_training_modes: dict[str, int],
        total_flops: int,
        **summarize_kwargs: Any,
    ) -> None:
        """Print the table (override to show it elsewhere)."""
        s = Summary(
            summary_data,
            total_parameters,
            trainable_parameters,
            model_size,
            total_training_modes,
            total_flops,
        )
        print(format_table(s))
