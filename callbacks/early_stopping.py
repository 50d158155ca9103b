"""EarlyStopping: stop training when a monitored metric stops improving (all ranks stop together)."""

from __future__ import annotations

import math
from enum import Enum
from typing import TYPE_CHECKING, Any

from callbacks.base import Callback
from callbacks.monitor import Monitor, any_rank_wants, at_train_epoch_end, fitting
from tandem_core.errors import ConfigError

if TYPE_CHECKING:
    from trainer.task.base import Task
    from trainer.trainer import Trainer


class EarlyStoppingReason(Enum):
    """Why EarlyStopping stopped the run (``EarlyStopping.stopping_reason``); the words are in
    ``stopping_reason_message``."""

    NOT_STOPPED = 0
    STOPPING_THRESHOLD = 1
    DIVERGENCE_THRESHOLD = 2
    PATIENCE_EXHAUSTED = 3
    NON_FINITE_METRIC = 4


class EarlyStopping(Callback):
    """Stops when `monitor` has not improved by more than `min_delta` for `patience` checks.

    Also stops at once when the value reaches `stopping_threshold`, goes beyond `divergence_threshold`, or
    is not finite (`check_finite`). Checked after each training epoch (after its validation), or after each
    validation run when validation runs at other times. Example::

        Trainer(callbacks=[EarlyStopping("val/loss", patience=3, mode="min")])
    """

    monitoring = True  # runs after the task's hooks, so it sees this epoch's metrics

    def __init__(
        self,
        monitor: str,
        min_delta: float = 0.0,
        patience: int = 3,
        verbose: bool = False,
        mode: str = "min",
        strict: bool = True,
        check_finite: bool = True,
        stopping_threshold: float | None = None,
        divergence_threshold: float | None = None,
        check_on_train_epoch_end: bool | None = None,
        log_rank_zero_only: bool = False,
    ) -> None:
        self._monitor = Monitor("EarlyStopping", monitor, mode, min_delta)
        if not isinstance(patience, int) or patience < 0:
            raise ConfigError(f"EarlyStopping(patience=...) must be an int >= 0, got {patience!r}.")
        self.patience = patience
        self.verbose = verbose
        self.strict = strict
        self.check_finite = check_finite
        self.stopping_threshold = stopping_threshold
        self.divergence_threshold = divergence_threshold
        self._check_on_train_epoch_end = check_on_train_epoch_end
        self.log_rank_zero_only = (
            log_rank_zero_only  # False: every rank says why it stops, prefixed by its rank
        )
        self.wait_count = 0
        self.stopped_epoch = 0
        self.best_score = self._monitor.worst
        self.stopping_reason = EarlyStoppingReason.NOT_STOPPED
        self.stopping_reason_message: str | None = None
        self._why = EarlyStoppingReason.NOT_STOPPED  # of the last evaluate() that asked to stop

    @property
    def monitor(self) -> str:
        """The monitored key."""
        return str(self._monitor.key)

    @property
    def mode(self) -> str:
        """Which direction is an improvement: "min" or "max"."""
        return self._monitor.mode

    @property
    def min_delta(self) -> float:
        """How much better than the best a value must be to count as an improvement."""
        return self._monitor.min_delta

    @property
    def state_key(self) -> str:
        keys = {"monitor": self.monitor, "mode": self.mode}
        return f"{type(self).__qualname__}{keys}"  # a subclass saves under its own name (Lightning)

    # ----- when to check ------------------------------------------------------------------------
    def on_train_start(self, trainer: Trainer, task: Task) -> None:
        self._monitor.start()

    def on_train_epoch_end(self, trainer: Trainer, task: Task) -> None:
        if at_train_epoch_end(trainer, self._check_on_train_epoch_end):
            self._run_check(trainer)

    def on_validation_end(self, trainer: Trainer, task: Task) -> None:
        self._monitor.validation_ended(trainer)
        if fitting(trainer) and not at_train_epoch_end(trainer, self._check_on_train_epoch_end):
            self._run_check(trainer)

    # ----- the check ----------------------------------------------------------------------------
    def _run_check(self, trainer: Trainer) -> None:
        if trainer.config.fast_dev_run:
            return
        value = self._monitor.value(trainer, strict=self.strict, action="check")
        if value is None:
            return
        wants_stop, reason = self.evaluate(value)
        # every rank must leave the loop at the same step: stop everywhere if any rank wants to
        if any_rank_wants(trainer, wants_stop):
            trainer.should_stop = True
            self.stopped_epoch = trainer.current_epoch
            self.stopping_reason = self._why if wants_stop else EarlyStoppingReason.NOT_STOPPED
            self.stopping_reason_message = reason if wants_stop else "another rank asked to stop"
        if reason and self.verbose:
            if trainer.world_size > 1 and not self.log_rank_zero_only:
                print(f"[rank: {trainer.global_rank}] EarlyStopping: {reason}")
            else:
                trainer.print(f"EarlyStopping: {reason}")

    def evaluate(self, current: float) -> tuple[bool, str | None]:
        """Update the state with a new value of the metric; return (stop?, why)."""
        name, m = self.monitor, self._monitor
        why = EarlyStoppingReason
        if self.check_finite and not math.isfinite(current):
            self._why = why.NON_FINITE_METRIC
            return (
                True,
                f"{name} = {current} is not finite; previous best was {self.best_score:.4g}. Stopping.",
            )
        if self.stopping_threshold is not None and m.better(current, self.stopping_threshold):
            self._why = why.STOPPING_THRESHOLD
            return (
                True,
                f"Stopping threshold reached: {name} = {current:.4g} is better than {self.stopping_threshold}.",
            )
        if self.divergence_threshold is not None and m.better(self.divergence_threshold, current):
            self._why = why.DIVERGENCE_THRESHOLD
            return (
                True,
                f"Divergence threshold reached: {name} = {current:.4g} is worse than {self.divergence_threshold}.",
            )
        if m.improves(current, self.best_score):
            improved = "" if math.isinf(self.best_score) else f" (by {abs(self.best_score - current):.4g})"
            self.best_score, self.wait_count = current, 0
            return False, f"{name} improved{improved} to {current:.4g}."
        self.wait_count += 1
        if self.wait_count >= self.patience:
            self._why = why.PATIENCE_EXHAUSTED
            return True, (
                f"{name} did not improve for {self.wait_count} checks; best was {self.best_score:.4g}. "
                "Stopping."
            )
        return False, None

    # ----- checkpoint ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "wait_count": self.wait_count,
            "stopped_epoch": self.stopped_epoch,
            "best_score": self.best_score,
            "patience": self.patience,
            "stopping_reason": self.stopping_reason.value,
            "stopping_reason_message": self.stopping_reason_message,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.wait_count = state["wait_count"]
        self.stopped_epoch = state["stopped_epoch"]
        self.best_score = float(state["best_score"])
        self.stopping_reason = EarlyStoppingReason(state.get("stopping_reason", 0))
        self.stopping_reason_message = state.get("stopping_reason_message")
