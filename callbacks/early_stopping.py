"""EarlyStopping: stop training when a monitored metric stops improving (all ranks stop together)."""

from __future__ import annotations

import math
import warnings
from typing import TYPE_CHECKING, Any

import torch

from callbacks.base import Callback
from trainer.errors import ConfigError, choose

if TYPE_CHECKING:
    from trainer.task import Task
    from trainer.trainer import Trainer


def missing_key_message(owner: str, key: str, trainer: Trainer) -> str:
    logged = sorted(trainer.callback_metrics)
    return (
        f"{owner} monitors {key!r}, which was never logged; logged keys: {logged}. "
        f"Log it with self.log({key!r}, value) in the task, or pick one of the logged keys."
    )


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
    ) -> None:
        choose("EarlyStopping mode", mode, ("min", "max"))
        if not isinstance(patience, int) or patience < 0:
            raise ConfigError(f"EarlyStopping(patience=...) must be an int >= 0, got {patience!r}.")
        self.monitor = monitor
        self.min_delta = abs(min_delta)
        self.patience = patience
        self.verbose = verbose
        self.mode = mode
        self.strict = strict
        self.check_finite = check_finite
        self.stopping_threshold = stopping_threshold
        self.divergence_threshold = divergence_threshold
        self._check_on_train_epoch_end = check_on_train_epoch_end
        self.wait_count = 0
        self.stopped_epoch = 0
        self.best_score = math.inf if mode == "min" else -math.inf
        self.stopping_reason: str | None = None

    @property
    def state_key(self) -> str:
        return f"EarlyStopping{{'monitor': {self.monitor!r}, 'mode': {self.mode!r}}}"

    def _better(self, a: float, b: float) -> bool:
        return a < b if self.mode == "min" else a > b

    # ----- when to check ------------------------------------------------------------------------
    def _on_epoch_end(self, trainer: Trainer) -> bool:
        if self._check_on_train_epoch_end is not None:
            return self._check_on_train_epoch_end
        cfg = trainer.config
        no_val = not trainer.val_dataloaders or sum(trainer.num_val_batches) == 0
        return no_val or (cfg.val_check_interval == 1.0 and cfg.check_val_every_n_epoch == 1)

    def on_train_epoch_end(self, trainer: Trainer, task: Task) -> None:
        if self._on_epoch_end(trainer):
            self._run_check(trainer)

    def on_validation_end(self, trainer: Trainer, task: Task) -> None:
        if trainer.stage == "fit" and not trainer.sanity_checking and not self._on_epoch_end(trainer):
            self._run_check(trainer)

    # ----- the check ----------------------------------------------------------------------------
    def _run_check(self, trainer: Trainer) -> None:
        if trainer.config.fast_dev_run:
            return
        value = trainer.callback_metrics.get(self.monitor)
        if value is None:
            if self.strict:
                raise ConfigError(
                    missing_key_message(f"EarlyStopping(monitor={self.monitor!r})", self.monitor, trainer)
                )
            warnings.warn(
                missing_key_message(f"EarlyStopping(monitor={self.monitor!r})", self.monitor, trainer),
                stacklevel=2,
            )
            return
        wants_stop, reason = self.evaluate(float(value))
        # every rank must leave the loop at the same step: stop everywhere if any rank wants to
        flag = torch.tensor(float(wants_stop), device=trainer.strategy.root_device)
        if bool(trainer.strategy.comm.reduce(flag, "max").item() > 0):
            trainer.should_stop = True
            self.stopped_epoch = trainer.current_epoch
            self.stopping_reason = reason if wants_stop else "another rank asked to stop"
        if reason and self.verbose:
            trainer.print(f"EarlyStopping: {reason}")

    def evaluate(self, current: float) -> tuple[bool, str | None]:
        """Update the state with a new value of the metric; return (stop?, why)."""
        name = self.monitor
        if self.check_finite and not math.isfinite(current):
            return (
                True,
                f"{name} = {current} is not finite; previous best was {self.best_score:.4g}. Stopping.",
            )
        if self.stopping_threshold is not None and self._better(current, self.stopping_threshold):
            return (
                True,
                f"stopping threshold reached: {name} = {current:.4g} is better than {self.stopping_threshold}.",
            )
        if self.divergence_threshold is not None and self._better(self.divergence_threshold, current):
            return (
                True,
                f"divergence threshold reached: {name} = {current:.4g} is worse than {self.divergence_threshold}.",
            )
        delta = -self.min_delta if self.mode == "min" else self.min_delta
        if self._better(current, self.best_score + delta):
            improved = "" if math.isinf(self.best_score) else f" (by {abs(self.best_score - current):.4g})"
            self.best_score, self.wait_count = current, 0
            return False, f"{name} improved{improved} to {current:.4g}."
        self.wait_count += 1
        if self.wait_count >= self.patience:
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
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.wait_count = state["wait_count"]
        self.stopped_epoch = state["stopped_epoch"]
        self.best_score = float(state["best_score"])
