"""ModelSummary: a table of the task's layers and parameter counts, printed when fit starts."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from callbacks.base import Callback

if TYPE_CHECKING:
    from trainer.task.base import Task
    from trainer.trainer import Trainer


def _count(n: int) -> str:
    """1234 -> '1.2 K', as in Lightning's summary."""
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return str(n)


def _numel(p: torch.Tensor) -> int:
    return 0 if isinstance(p, torch.nn.parameter.UninitializedParameter) else p.numel()


def summarize(module: torch.nn.Module, max_depth: int = 1) -> str:
    """The summary table: one row per submodule down to `max_depth` (-1: all), then the totals."""
    rows = [("", "Name", "Type", "Params", "Mode")]
    for name, sub in module.named_modules():
        depth = name.count(".") + 1
        if not name or (max_depth != -1 and depth > max_depth):
            continue
        params = sum(_numel(p) for p in sub.parameters())
        rows.append(
            (
                str(len(rows) - 1),
                name,
                type(sub).__name__,
                _count(params),
                "train" if sub.training else "eval",
            )
        )
    unique = {id(p): p for p in module.parameters()}.values()  # shared parameters count once
    trainable = sum(_numel(p) for p in unique if p.requires_grad)
    total = sum(_numel(p) for p in unique)
    size_mb = sum(_numel(p) * p.element_size() for p in unique) / 1e6
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = [" | ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
    rule = "-" * max(len(line) for line in lines)
    lines = [lines[0], rule, *lines[1:], rule]
    lines += [
        f"{_count(trainable):<10}Trainable params",
        f"{_count(total - trainable):<10}Non-trainable params",
        f"{_count(total):<10}Total params",
        f"{size_mb:<10.3f}Total estimated model params size (MB)",
    ]
    return "\n".join(lines)


class ModelSummary(Callback):
    """Prints the task's layers, parameter counts (total, trainable) and size in MB at the start of fit.

    Added by the Trainer unless ``enable_model_summary=False``. Example: ``ModelSummary(max_depth=2)``.
    """

    def __init__(self, max_depth: int = 1) -> None:
        self.max_depth = max_depth

    def on_fit_start(self, trainer: Trainer, task: Task) -> None:
        """Print the table on rank 0."""
        if trainer.is_global_zero and self.max_depth != 0:
            print(summarize(task, self.max_depth))
