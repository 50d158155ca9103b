"""When ModelCheckpoint saves: every n epochs, every n optimizer steps, or every time interval."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import TYPE_CHECKING

from callbacks.monitor import rank_zero_decides
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
        given = [n for n, v in triggers.items() if v]
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
        self.interval_s = train_time_interval.total_seconds() if train_time_interval else 0.0
        no_trigger = not every_n_train_steps and every_n_epochs is None and not train_time_interval
        self.every_n_epochs = 1 if no_trigger else (every_n_epochs or 0)
        self.every_n_train_steps = every_n_train_steps or 0
        self._last_time = time.monotonic()

    def __eq__(self, other: object) -> bool:
        """Equal state (a pickled and reloaded callback equals the original, as Lightning's do)."""
        return type(other) is type(self) and vars(other) == vars(self)

    __hash__ = None  # type: ignore[assignment]  # (mutable state)

    @property
    def per_step(self) -> bool:
        """True when saves may fall inside an epoch (a step count or a time interval)."""
        return bool(self.every_n_train_steps or self.interval_s)

    def restart(self) -> None:
        """Start the time interval afresh (at the start of training)."""
        self._last_time = time.monotonic()

    def step_due(self, trainer: Trainer) -> bool:
        """True when this optimizer step should save; the same answer on every rank."""
        due = bool(self.every_n_train_steps) and trainer.global_step % self.every_n_train_steps == 0
        if self.interval_s:
            now = time.monotonic()
            # clocks differ: rank 0 decides, or the ranks would not save together
            late = rank_zero_decides(trainer, now - self._last_time >= self.interval_s)
            if late:
                self._last_time = now
            due = due or late
        return due

    def epoch_due(self, trainer: Trainer) -> bool:
        """True when the epoch that is ending should save into the top k."""
        return self.every_n_epochs >= 1 and (trainer.current_epoch + 1) % self.every_n_epochs == 0
