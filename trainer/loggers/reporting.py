"""Metrics to the loggers: where logged tensors become floats (rank 0 writes), the hyperparameters at each
stage's start, and the run's last word."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from trainer.loggers.logged import remember
from trainer.loggers.metrics import to_floats
from trainer.secrets import redact

if TYPE_CHECKING:
    from trainer.trainer import Trainer


def log_metrics(t: Trainer, metrics: dict[str, Any], step: int | None = None) -> None:
    """Send metrics to the loggers (rank 0, not during the sanity check); one host copy per device. The step
    is Lightning's: inside fit the optimizer steps taken before the current one (global_step - 1 after a
    step), else global_step, or the value the task logged as "step" (which is then no metric); without a
    `step` "epoch" is added as an int unless the task logged its own."""
    if not metrics:
        return
    remember(t, metrics)  # trainer.logged_metrics: tensors, logger or not (Lightning's; loggers/logged.py)
    if not t.loggers:
        return
    values: dict[str, float | int] = {k: float(v) for k, v in to_floats(metrics).items()}
    if step is None and "step" in values:  # a metric logged as "step" is the step to write at (Lightning's)
        step = int(values.pop("step"))
    if t.is_global_zero and not t.state.sanity_checking:
        if step is None:
            values.setdefault("epoch", t.state.epoch)
            step = t.state.global_step
            if t.state.entry == "fit" and step > 0:
                step -= 1
        for lg in t.loggers:
            lg.log_metrics(metrics=values, step=step)  # by keyword, as Lightning calls a logger


def stage_hparams(t: Trainer) -> dict[str, Any] | None:
    """What the loggers get at the start of a stage, as Lightning 2.6: the task's hparams_initial and the
    DataModule's, merged (a key both hold with different values is an error), each only if its
    save_hyperparameters(logger=...) allows (never without a save_hyperparameters call); None when neither does. LightningCLI's "_class_path" is left out."""
    task, dm = t.task, t.datamodule
    task_on = task is not None and getattr(task, "_log_hyperparams", False)
    dm_on = dm is not None and getattr(dm, "_log_hyperparams", False)
    parts = [p.hparams_initial for p, on in ((task, task_on), (dm, dm_on)) if on]  # type: ignore[union-attr]
    if not parts:
        return None
    if len(parts) == 2:
        both = [k for k in parts[0] if k in parts[1] and k != "_class_path"]
        differ = [k for k in both if not _same(parts[0][k], parts[1][k])]
        if differ:
            raise RuntimeError(
                f"Error while merging hparams: the keys {differ} are present in both the Task's and the "
                "DataModule's hparams but have different values; rename one of them, or pass logger=False "
                "to one of the save_hyperparameters() calls."
            )
    merged = {k: v for part in parts for k, v in part.items() if k != "_class_path"}
    return redact(merged, t.config_secrets)  # no secret values


def _same(a: Any, b: Any) -> bool:
    """Lightning's test: the same type and equal, and a tensor only as the very same object."""
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return a is b
    return bool(a == b)


def log_stage_start(t: Trainer) -> None:
    """At the start of every stage (fit: after on_fit_start, before the training state is restored), as
    Lightning with enable_autolog_hparams: each logger gets log_hyperparams(stage_hparams), draws the task's
    graph where it can (TensorBoardLogger(log_graph=True)), and saves, so that a run killed later has them."""
    t.metric_store.no_logger = not t.loggers  # self.log(..., logger=True) then warns, as Lightning
    if not t.loggers or not t.config.enable_autolog_hparams or t.task is None:
        return
    params = stage_hparams(t)  # every rank: a conflict fails them all
    if not t.is_global_zero:
        return
    for lg in t.loggers:
        if params is not None:
            lg.log_hyperparams(params)
        if hasattr(lg, "log_graph"):
            lg.log_graph(t.task)
        lg.save()


def finalize_loggers(t: Trainer, status: str) -> None:
    """Close the loggers (rank 0); the hyperparameters were written when the stage started."""
    if not t.is_global_zero:
        return
    for lg in t.loggers:
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
