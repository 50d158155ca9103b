"""`trainer.logged_metrics` as Lightning keeps it: every value logged with `logger=True`, the latest of each,
whether or not a logger is configured and whether or not `log_every_n_steps` sent it to one (Lightning updates
it at every batch's end and reads the current batch's values live). Values wait here as tensors and become
floats only when read, so a run that never reads them copies nothing to the host."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainer.loggers.metrics import to_floats

if TYPE_CHECKING:
    from trainer.trainer import Trainer


def remember(t: Trainer, metrics: dict[str, Any]) -> None:
    """Keep `metrics` (still tensors) as the latest logged values; converted when read."""
    if metrics:
        t._logged_pending.update(metrics)


def settle(t: Trainer, values: dict[str, float]) -> None:
    """Record values already converted (those sent to a logger): they are newer than anything waiting."""
    flush(t)
    t._logged_metrics.update(values)


def flush(t: Trainer) -> dict[str, float]:
    """The logged values, with those waiting converted (and, inside a batch, that batch's values so far)."""
    store = t.metric_store
    if store.fx is not None:  # read inside a batch: its values so far, as Lightning's live read
        remember(t, store.step_metrics())
    if t._logged_pending:
        t._logged_metrics.update(to_floats(t._logged_pending))
        t._logged_pending.clear()
    return t._logged_metrics


def forget(t: Trainer) -> None:
    """Drop everything (after the sanity check, as Lightning resets its logged metrics)."""
    t._logged_pending.clear()
    t._logged_metrics.clear()
