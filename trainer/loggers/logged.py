"""`trainer.logged_metrics` as Lightning keeps it: every value logged with `logger=True`, the latest of each, as a
(detached) tensor, whether or not a logger is configured and whether or not `log_every_n_steps` sent it to one
(Lightning updates it at every batch's end and reads the current batch's values live).

Computed when read, not at every step: inside the training batches the store collects the step values meant
for loggers in `MetricStore.pending` (one dict write per self.log), and they join the logged values when
`trainer.logged_metrics` is read, when a logger gets metrics, and at the epoch's end, in the order Lightning
would have written them. Keeping a tensor costs no host copy; the loggers get floats
(trainer/loggers/reporting.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from trainer.trainer import Trainer


def _take_pending(t: Trainer) -> None:
    """The training step values logged since the last read join the logged values."""
    pending = t.metric_store.pending
    if pending:
        t._logged_metrics.update({k: v.detach() if v.requires_grad else v for k, v in pending.items()})
        pending.clear()


def remember(t: Trainer, metrics: dict[str, Any]) -> None:
    """Keep `metrics` as the latest logged values (tensors detached, nothing copied to the host)."""
    _take_pending(t)
    t._logged_metrics.update(
        {k: v.detach() if isinstance(v, torch.Tensor) else v for k, v in metrics.items()}
    )


def current(t: Trainer) -> dict[str, Any]:
    """The logged values (and, read inside a batch, that batch's values so far, as Lightning's live read)."""
    store = t.metric_store
    if store.fx is not None:
        remember(t, store.step_metrics())
    else:
        _take_pending(t)
    return t._logged_metrics


def open_batches(t: Trainer) -> None:
    """The training batches start: their step values are collected for trainer.logged_metrics."""
    if t.metric_store.pending is None:
        t.metric_store.pending = {}


def close_batches(t: Trainer) -> None:
    """The training batches are over: what they logged joins the logged values."""
    _take_pending(t)
    t.metric_store.pending = None


def forget(t: Trainer) -> None:
    """Drop everything (after the sanity check, as Lightning resets its logged metrics)."""
    t._logged_metrics.clear()
    if t.metric_store.pending:
        t.metric_store.pending.clear()
