"""Timer: stop training after a wall-clock duration; records the time each stage took."""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from callbacks.base import Callback
from callbacks.monitor import rank_zero_decides
from tandem_core.errors import ConfigError, check_choice

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from trainer.task.base import Task
    from trainer.trainer import Trainer


def parse_duration(duration: str | timedelta | dict[str, int] | float | None) -> timedelta | None:
    """'DD:HH:MM:SS', a timedelta, a dict of timedelta keywords, or seconds; a positive, finite duration."""
    if duration is None:
        return None
    try:
        parsed = _parse(duration)
    except (TypeError, ValueError, OverflowError) as e:  # NaN, absurdly large, wrong keywords
        raise ConfigError(f"Timer duration {duration!r} is not a usable duration ({e}).") from e
    if parsed is not None and parsed < timedelta(
        0
    ):  # 0 (as Lightning): stop at the first check, on_fit_start
        raise ConfigError(f"Timer duration must not be negative, got {duration!r}.")
    if parsed is not None:
        return parsed
    raise ConfigError(
        f"Timer duration must be 'DD:HH:MM:SS', a timedelta, a dict like {{'hours': 2}} or seconds; got {duration!r}."
    )


def _parse(duration: Any) -> timedelta | None:
    if isinstance(duration, timedelta):
        return duration
    if isinstance(duration, dict):
        return timedelta(**duration)
    if isinstance(duration, (int, float)) and not isinstance(duration, bool):
        return timedelta(seconds=duration)
    if isinstance(duration, str):
        parts = duration.strip().split(":")
        if len(parts) == 4 and all(p.strip().isdigit() for p in parts):
            days, hours, minutes, seconds = (int(p) for p in parts)
            return timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)
    return None


class Timer(Callback):
    """Stops training once `duration` has passed (checked after every step, or every epoch).

    ``Trainer(max_time="00:12:00:00")`` adds one. The elapsed training time is kept in checkpoints, so a
    resumed run stops after the remaining time. Example: ``Timer(duration={"minutes": 30}, interval="epoch")``.
    """

    def __init__(
        self,
        duration: str | timedelta | dict[str, int] | float | None = None,
        interval: str = "step",
        verbose: bool = True,
    ) -> None:
        check_choice("Timer interval", interval, ("step", "epoch"))
        self.duration = parse_duration(duration)
        self._duration_s = self.duration.total_seconds() if self.duration is not None else float("inf")
        self.interval = interval
        self.verbose = verbose
        self._start: dict[str, float | None] = {"train": None, "validate": None, "test": None}
        self._end: dict[str, float | None] = {"train": None, "validate": None, "test": None}
        self._offset = 0.0  # training seconds of the run this one resumes

    def start_time(self, stage: str = "train") -> float | None:
        """time.monotonic() at the start of `stage`."""
        return self._start[stage]

    def end_time(self, stage: str = "train") -> float | None:
        """When `stage` ended (time.monotonic() seconds), or None while it runs or before it started."""
        return self._end[stage]

    def time_elapsed(self, stage: str = "train") -> float:
        """Seconds spent in `stage` (training includes the run this one resumed)."""
        start, end = self._start[stage], self._end[stage]
        offset = self._offset if stage == "train" else 0.0
        if start is None:
            return offset
        return offset + (end if end is not None else time.monotonic()) - start

    def time_remaining(self, stage: str = "train") -> float | None:
        """Seconds left of the duration in `stage`, or None without a duration."""
        return None if self.duration is None else self._duration_s - self.time_elapsed(stage)

    # ----- stages --------------------------------------------------------------------------------
    def on_fit_start(self, trainer: Trainer, task: Task) -> None:
        """Checked once before training whatever the interval, as Lightning: a restored timer may be spent."""
        self._check(trainer)

    def on_train_start(self, trainer: Trainer, task: Task) -> None:
        self._start["train"], self._end["train"] = time.monotonic(), None

    def on_train_end(self, trainer: Trainer, task: Task) -> None:
        self._end["train"] = time.monotonic()

    def on_validation_start(self, trainer: Trainer, task: Task) -> None:
        self._start["validate"], self._end["validate"] = time.monotonic(), None

    def on_validation_end(self, trainer: Trainer, task: Task) -> None:
        self._end["validate"] = time.monotonic()

    def on_test_start(self, trainer: Trainer, task: Task) -> None:
        self._start["test"], self._end["test"] = time.monotonic(), None

    def on_test_end(self, trainer: Trainer, task: Task) -> None:
        self._end["test"] = time.monotonic()

    # ----- the check ------------------------------------------------------------------------------
    def on_train_batch_end(
        self, trainer: Trainer, task: Task, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.interval == "step":
            self._check(trainer)

    def on_train_epoch_end(self, trainer: Trainer, task: Task) -> None:
        if self.interval == "epoch":
            self._check(trainer)

    def _check(self, trainer: Trainer) -> None:
        if self.duration is None:
            return
        stop = self.time_elapsed("train") >= self._duration_s
        stop = bool(rank_zero_decides(trainer, stop))  # clocks differ between ranks: rank 0 decides for all
        if stop and not trainer.should_stop:
            trainer.should_stop = True
            if self.verbose:  # printed, and logged at INFO as Lightning logs it (for log handlers and caplog)
                said = (
                    f"Time limit reached. {self.duration} of training have passed. Signaling Trainer to stop."
                )
                trainer.print(said)
                if trainer.is_global_zero:
                    log.info(said)

    # ----- checkpoint -----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"time_elapsed": {stage: self.time_elapsed(stage) for stage in self._start}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._offset = float(state.get("time_elapsed", {}).get("train", 0.0))
