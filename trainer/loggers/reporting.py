"""Metrics to the loggers: where logged tensors become floats (rank 0 writes), and the run's last word."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from trainer.loggers.metrics import to_floats
from trainer.secrets import redact

if TYPE_CHECKING:
    from trainer.trainer import Trainer


def log_metrics(t: Trainer, metrics: dict[str, torch.Tensor], step: int | None = None) -> None:
    """Send metrics to the loggers (rank 0, not during the sanity check); one host copy per device. The step
    is Lightning's: inside fit the optimizer steps taken before the current one (global_step - 1 after a
    step), else global_step; "epoch" is added as an int unless the task logged its own."""
    if not metrics:
        return
    values: dict[str, float | int] = {k: float(v) for k, v in to_floats(metrics).items()}
    t.logged_metrics.update(values)
    if t.loggers and t.is_global_zero and not t.state.sanity_checking:
        values.setdefault("epoch", t.state.epoch)
        if step is None:
            step = t.state.global_step
            if t.state.stage == "fit" and step > 0:
                step -= 1
        for lg in t.loggers:
            lg.log_metrics(values, step)


def log_graphs(t: Trainer) -> None:
    """At the start of fit, as Lightning (with enable_autolog_hparams): loggers that draw the task's graph
    (TensorBoardLogger(log_graph=True)) do so now; rank 0."""
    if t.is_global_zero and t.config.enable_autolog_hparams and t.task is not None:
        for lg in t.loggers:
            if hasattr(lg, "log_graph"):
                lg.log_graph(t.task)


def finalize_loggers(t: Trainer, status: str) -> None:
    """Write the hyperparameters with the final metrics, and close the loggers (rank 0)."""
    if not t.is_global_zero:
        return
    autolog = t.config.enable_autolog_hparams and t.task is not None and t.task.hparams
    for lg in t.loggers:
        if autolog and getattr(t.task, "_log_hyperparams", True):
            final = {k: float(v) for k, v in t.callback_metrics.items()}
            lg.log_hyperparams(redact(dict(t.task.hparams), t.config_secrets), final)  # no secret values
        lg.finalize(status)


def print_results(stage: str, results: list[dict[str, float]]) -> None:
    """The table Lightning prints after validate()/test(): one column per loader."""
    if not results or not any(results):
        return
    keys = sorted({k for r in results for k in r})
    width = max(len(k) for k in keys)
    head = f"{stage.capitalize() + ' metric':<{max(width, 13)}}" + "".join(
        f"  {'DataLoader ' + str(i):>14}" for i in range(len(results))
    )
    print(head)
    print("-" * len(head))
    for k in keys:
        cells = "".join(
            f"  {results[i][k]:>14.6g}" if k in results[i] else f"  {'':>14}" for i in range(len(results))
        )
        print(f"{k:<{max(width, 13)}}{cells}")
