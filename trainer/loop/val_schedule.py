"""When fit validates inside and at the end of a training epoch: val_check_interval (a fraction of the epoch, a
count of batches or a duration) gated by check_val_every_n_epoch, read as Lightning reads them."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import TYPE_CHECKING

from tandem_core.errors import ConfigError, TaskError

if TYPE_CHECKING:
    from trainer.trainer import Trainer


def val_check_seconds(t: Trainer) -> float | None:
    """The seconds of a time-based val_check_interval ('DD:HH:MM:SS', a timedelta or a dict), else None."""
    v = t.config.val_check_interval
    if not isinstance(v, (str, dict, timedelta)):
        return None
    from callbacks.timer import parse_duration  # (checked when the option was given)

    return parse_duration(v).total_seconds()  # type: ignore[union-attr]


def time_due(t: Trainer, seconds: float) -> bool:
    """Whether `seconds` passed since the last validation (or the start of training); rank 0's clock decides,
    so that every rank validates at the same batch."""
    due = time.monotonic() - t.session.last_val_time >= seconds  # type: ignore[union-attr]
    comm = t.strategy.comm
    return bool(comm.broadcast(due, 0)) if comm.world_size > 1 else due


def val_check_batches(t: Trainer) -> int:
    """Run validation every this many training batches inside the epoch (0: only at the epoch's end)."""
    v = t.config.val_check_interval
    if not t.session.val_enabled or (isinstance(v, float) and v == 1.0):  # type: ignore[union-attr]
        return 0
    if not isinstance(v, (int, float)):  # a duration: _val_check_seconds
        return 0
    if isinstance(v, float):
        n = t.num_training_batches
        if n == float("inf"):
            raise TaskError(
                "val_check_interval as a fraction needs a training loader with a length; pass an int."
            )
        return max(1, int(n * v))
    n = t.num_training_batches
    if v > n and t.config.check_val_every_n_epoch is not None:  # it would never validate
        raise ConfigError(
            f"val_check_interval={v} is more than the {n} training batches of an epoch, so fit would never "
            "validate: lower it, set check_val_every_n_epoch=None to count batches over the whole run, or "
            "limit_val_batches=0 to train without validation."
        )
    return int(v)


def should_validate(t: Trainer) -> bool:
    """Whether this epoch validates at all (validation enabled and check_val_every_n_epoch)."""
    every = t.config.check_val_every_n_epoch
    return t.session.val_enabled and (every is None or (t.state.epoch + 1) % every == 0)  # type: ignore[union-attr]


def val_check_batch(t: Trainer) -> int | float | None:
    """Lightning's `trainer.val_check_batch`: once fit has its training loader, the training batches between
    validations as val_check_interval gives them (an int as given; a fraction of the epoch's batches, at least
    1; `inf` for 1.0 over a loader without length); None before, for a duration, or with no training batch."""
    v, n = t.config.val_check_interval, t.num_training_batches
    if "train" not in t.loaders or not n or not isinstance(v, (int, float)) or isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if n == float("inf"):
        return float("inf") if v == 1.0 else None
    return max(1, int(n * v))


def load_val(t: Trainer) -> None:
    """Fit's validation loaders, asked for when Lightning asks: when first needed (the sanity check, the start
    of training when its first epoch validates, a validation), and again at a validation
    `reload_dataloaders_every_n_epochs` epochs or more after the last load. A load in the sanity check counts
    as one only when its epoch validates (as Lightning's)."""
    session, n, epoch = t.session, t.config.reload_dataloaders_every_n_epochs, t.state.epoch
    assert session is not None
    if "val" in t.loaders and not (n and epoch - session.val_loaded_epoch >= n):
        return
    session.reload("val")
    if not t.state.sanity_checking or should_validate(t):
        session.val_loaded_epoch = epoch
