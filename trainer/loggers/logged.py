"""`trainer.logged_metrics` as Lightning keeps it: every value logged with `logger=True`, the latest of each, as a
(detached) tensor, whether or not a logger is configured and whether or not `log_every_n_steps` sent it to one
(Lightning updates it at every batch's end and reads the current batch's values live). Keeping a tensor costs
no host copy; the loggers get floats (trainer/loggers/reporting.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from trainer.trainer import Trainer


def remember(t: Trainer, metrics: dict[str, Any]) -> None:
    """Keep `metrics` as the latest logged values (tensors detached, nothing copied to the host)."""
    t._logged_metrics.update(
        {k: v.detach() if isinstance(v, torch.Tensor) else v for k, v in metrics.items()}
    )


def current(t: Trainer) -> dict[str, Any]:
    """The logged values (and, read inside a batch, that batch's values so far, as Lightning's live read)."""
    store = t.metric_store
    if store.fx is not None:
        remember(t, store.step_metrics())
    return t._logged_metrics


def forget(t: Trainer) -> None:
    """Drop everything (after the sanity check, as Lightning resets its logged metrics)."""
    t._logged_metrics.clear()
