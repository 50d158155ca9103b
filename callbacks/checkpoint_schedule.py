"""When ModelCheckpoint saves: every n epochs, every n optimizer steps, or every time interval."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from callbacks.monitor import at_train_epoch_end, no_validation, rank_zero_decides
from tandem_core.errors import ConfigError

if TYPE_CHECKING:
    from trainer.trainer import Trainer


class SaveSchedule:
    """One of the three triggers (every epoch when none is given); checks the arguments.

    Example: ``SaveSchedule(every_n_train_steps=100, train_time_interval=None, every_n_epochs=None)``.
    """

    def __init__(
        self,
        every_n_train_steps: int | None,
        train_time_interval: timedelta | float | None,
        every_n_epochs: int | None,
    ) -> None:
        triggers = {
            "every_n_train_steps": every_n_train_steps,
            "every_n_epochs": every_n_epochs,
            "train_time_interval": train_time_interval,
        }
        # a zero interval is an interval (save at every step), as in Lightning
        given = [n for n, v in triggers.items() if v or (n == "train_time_interval" and v is not None)]
        if len(given) > 1:
            raise ConfigError(
                f"ModelCheckpoint: {' and '.join(given)} are mutually exclusive; pass one of them."
            )
        for name, v in (("every_n_train_steps", every_n_train_steps), ("every_n_epochs", every_n_epochs)):
            if v is not None and (not isinstance(v, int) or v < 0):
                raise ConfigError(f"ModelCheckpoint({name}=...) must be an int >= 0, got {v!r}.")
        if isinstance(train_time_interval, (int, float)):
            train_time_interval = timedelta(seconds=train_time_interval)
        self.train_time_interval = train_time_interval
        self.timed = train_time_interval is not None
        self.interval_s = train_time_interval.total_seconds() if train_time_interval else 0.0
        no_trigger = not every_n_train_steps and every_n_epochs is None and train_time_interval is None
        self.every_n_epochs = 1 if no_trigger else (every_n_epochs or 0)
        self.every_n_train_steps = every_n_train_steps or 0
        # saves may fall inside an epoch (a step count or a time interval): read at every training batch
        self.per_step = bool(self.every_n_train_steps or self.timed)
        self._last_time: float | None = None  # the clock is read when training starts, as Lightning reads it

    def __eq__(self, other: object) -> bool:
        """Equal state (a pickled and reloaded callback equals the original, as Lightning's do)."""
        return type(other) is type(self) and vars(other) == vars(self)

    __hash__ = None  # type: ignore[assignment]  # (mutable state)

    def restart(self) -> None:
        """Start the time interval afresh (at the start of training)."""
        self._last_time = time.monotonic()

    def step_due(self, trainer: Trainer) -> bool:
        """True when this optimizer step should save; the same answer on every rank."""
        due = bool(self.every_n_train_steps) and trainer.global_step % self.every_n_train_steps == 0
        if self.timed:
            now = time.monotonic()
            # clocks differ: rank 0 decides, or the ranks would not save together
            started = self._last_time is not None
            late = rank_zero_decides(trainer, started and now - self._last_time >= self.interval_s)
            if late:
                self._last_time = now
            due = due or late
        return due

    def epoch_due(self, trainer: Trainer) -> bool:
        """True when the epoch that is ending should save into the top k."""
        return self.every_n_epochs >= 1 and (trainer.current_epoch + 1) % self.every_n_epochs == 0


def waits_for_validation(cb: Any, trainer: Trainer, automatic: bool, batch_idx: int) -> bool:
    """Whether a step- or time-triggered save of ModelCheckpoint `cb` waits for the next validation's end
    (Lightning 2.6): its monitored key is not logged yet while a validation is still to come, or (automatic
    optimization) the epoch's last batch is followed by a validation that refreshes a stale value."""
    if cb.monitor is None or no_validation(trainer):
        return False
    if cb.monitor not in trainer.callback_metrics:
        return not cb._monitor.validated  # missing after a validation: a typo, which the save reports
    if not automatic or at_train_epoch_end(trainer, cb._save_on_train_epoch_end):
        return False
    every = trainer.check_val_every_n_epoch
    validates = every is None or (trainer.current_epoch + 1) % every == 0
    return validates and batch_idx + 1 == trainer.num_training_batches
