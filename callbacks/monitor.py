"""What ModelCheckpoint and EarlyStopping share: when to look at a metric, how to compare it, what to do
while it is missing, and how every rank reaches the same decision."""

from __future__ import annotations

import math
import warnings
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from tandem_core.errors import ConfigError, check_choice

if TYPE_CHECKING:
    from trainer.trainer import Trainer

T = TypeVar("T")
MODES = ("min", "max")


# ----- when ---------------------------------------------------------------------------------------
def no_validation(trainer: Trainer) -> bool:
    """True when this fit runs no validation batches at all."""
    loaders = trainer.val_dataloaders  # None, or the loader(s) as given
    if loaders is None:  # not asked for yet (the first validation asks for them, as Lightning) or none at all
        return not getattr(trainer, "enable_validation", False)
    return loaders == [] or sum(trainer.num_val_batches) == 0


def fitting(trainer: Trainer) -> bool:
    """True inside fit, outside the sanity check: the only time a monitor acts on validation metrics."""
    return trainer.stage == "fit" and not trainer.sanity_checking


def at_train_epoch_end(trainer: Trainer, override: bool | None) -> bool:
    """Act at the end of each training epoch (True) or at the end of each validation run (False).

    The epoch end is the right moment when validation never runs, or runs exactly once per epoch (then it
    has already run); otherwise the callback acts after each validation. `override` is the user's choice.
    """
    if override is not None:
        return override
    cfg = trainer.config
    every_epoch = cfg.val_check_interval == 1.0 and cfg.check_val_every_n_epoch == 1
    return no_validation(trainer) or every_epoch


# ----- ranks --------------------------------------------------------------------------------------
def rank_zero_decides(trainer: Trainer, value: T) -> T:
    """Rank 0's `value` on every rank, so that all ranks act the same (identity on one process)."""
    if trainer.world_size == 1:
        return value
    return trainer.strategy.comm.broadcast(value, 0)


def any_rank_wants(trainer: Trainer, flag: bool) -> bool:
    """True on every rank when `flag` is set on any rank (a MAX all-reduce; identity on one process)."""
    tensor = torch.tensor(float(flag), device=trainer.strategy.root_device)
    return bool(trainer.strategy.comm.reduce(tensor, "max").item() > 0)


# ----- the monitored metric -----------------------------------------------------------------------
class Monitor:
    """A monitored metric: its key, which direction is better and by how much, and its missing-key policy.

    `owner` names the callback in messages. A key that is missing while a validation run of this fit is
    still to come only warns (once, on rank 0) and skips; after that it raises ConfigError (`strict`) or
    warns. Example::

        m = Monitor("EarlyStopping", "val/loss", mode="min", min_delta=0.01)
        m.improves(0.48, best=0.5)  # True: lower by more than 0.01
    """

    def __init__(self, owner: str, key: str | None, mode: str = "min", min_delta: float = 0.0) -> None:
        check_choice(f"{owner} mode", mode, MODES)
        self.owner = owner
        self.key = key
        self.mode = mode
        self.min_delta = abs(min_delta)
        self.validated = False  # a validation run of the current fit has ended
        self._warned: set[str] = set()

    def __eq__(self, other: object) -> bool:
        """Equal state (a pickled and reloaded callback equals the original, as Lightning's do)."""
        return type(other) is type(self) and vars(other) == vars(self)

    __hash__ = None  # type: ignore[assignment]  # (mutable state)

    # comparison
    @property
    def worst(self) -> float:
        """The value every real value improves on (+inf for "min", -inf for "max")."""
        return math.inf if self.mode == "min" else -math.inf

    def score(self, value: float) -> float:
        """`value`, with NaN replaced by the worst value (NaN compares false with everything)."""
        return self.worst if math.isnan(value) else value

    def better(self, a: float, b: float | None) -> bool:
        """True when `a` is strictly better than `b` (anything is better than None)."""
        if b is None:
            return True
        return a < b if self.mode == "min" else a > b

    def improves(self, current: float, best: float) -> bool:
        """True when `current` is better than `best` by more than min_delta."""
        return self.better(current, best - self.min_delta if self.mode == "min" else best + self.min_delta)

    def best_of(self, scores: dict[str, float]) -> str:
        """The key of the best value in `scores` (not empty)."""
        pick = min if self.mode == "min" else max
        return pick(scores, key=scores.__getitem__)

    def worst_of(self, scores: dict[str, float]) -> str:
        """The key of the worst value in `scores` (not empty)."""
        pick = max if self.mode == "min" else min
        return pick(scores, key=scores.__getitem__)

    # the missing-key policy
    def start(self) -> None:
        """A new fit begins: no validation of it has run yet."""
        self.validated = False

    def validation_ended(self, trainer: Trainer) -> None:
        """Note a finished validation run of this fit (not the sanity check)."""
        if fitting(trainer):
            self.validated = True

    def value(self, trainer: Trainer, strict: bool = True, action: str = "check") -> float | None:
        """The monitored value as a float, or None (after `missing`) when it was not logged."""
        assert self.key is not None, "a Monitor without a key has no value"
        found: Any = trainer.callback_metrics.get(self.key)
        if found is None:
            self.missing(trainer, self.missing_message(trainer), strict, action)
            return None
        return float(found)

    def missing_message(self, trainer: Trainer) -> str:
        """Says that the monitored key was never logged, and which keys were."""
        key = self.key
        return (
            f"{self.owner}(monitor={key!r}) monitors {key!r}, which was never logged; logged keys: "
            f"{sorted(trainer.callback_metrics)}. Log it with self.log({key!r}, value) in the task, or pick "
            "one of the logged keys."
        )

    def missing(self, trainer: Trainer, message: str, strict: bool = True, action: str = "check") -> None:
        """Raise ConfigError when the key can no longer appear (and `strict`); otherwise warn once and return.

        A validation metric cannot exist before this fit's first validation run, so until then the
        caller skips this `action` ("save", "check") instead of failing.
        """
        may_appear = not self.validated and not no_validation(trainer)
        if strict and not may_appear:
            raise ConfigError(message)
        if may_appear:
            message += f" Skipping this {action} until validation has run."
        if message not in self._warned and trainer.is_global_zero:
            warnings.warn(message, stacklevel=3)
        self._warned.add(message)
