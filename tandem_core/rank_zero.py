"""Rank-zero helpers, as Lightning's utilities of the same names: `rank_zero_only` (run a function on global rank
0 only) and `rank_zero_info/debug/warn/deprecation` (log or warn once per job, from rank 0). Any package may
use them; `trainer.utilities` re-exports them for users."""

from __future__ import annotations

import functools
import logging
import os
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

log = logging.getLogger("trainer.utilities.rank_zero")


class TandemDeprecationWarning(DeprecationWarning):
    """What `rank_zero_deprecation` warns with (Lightning's LightningDeprecationWarning)."""


def _global_rank() -> int:
    for var in ("RANK", "SLURM_PROCID"):  # set for every worker before the user's code runs
        if var in os.environ:
            return int(os.environ[var])
    return 0


class _RankZeroOnly:
    """`@rank_zero_only`: run a function on global rank 0 only; elsewhere it returns `default` (None). Example::

        @rank_zero_only
        def log_samples(self): ...

    `rank_zero_only.rank` is the global rank (read from the environment each time unless set, as Lightning's
    attribute of the same name is set by its Trainer).
    """

    def __init__(self) -> None:
        self._rank: int | None = None

    @property
    def rank(self) -> int:
        return _global_rank() if self._rank is None else self._rank

    @rank.setter
    def rank(self, value: int) -> None:
        self._rank = value

    @rank.deleter
    def rank(self) -> None:
        self._rank = None

    def __call__(self, fn: F, default: Any = None) -> F:
        @functools.wraps(fn)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            return fn(*args, **kwargs) if self.rank == 0 else default

        return wrapped  # type: ignore[return-value]


rank_zero_only = _RankZeroOnly()


# stacklevel counts from the logging/warnings call: the helper, its rank_zero_only wrapper, then the caller
@rank_zero_only
def rank_zero_debug(*args: Any, stacklevel: int = 4, **kwargs: Any) -> None:
    """Log at debug level on global rank 0 only."""
    _log(logging.DEBUG, *args, stacklevel=stacklevel, **kwargs)


@rank_zero_only
def rank_zero_info(*args: Any, stacklevel: int = 4, **kwargs: Any) -> None:
    """Log at info level on global rank 0 only."""
    _log(logging.INFO, *args, stacklevel=stacklevel, **kwargs)


@rank_zero_only
def rank_zero_warn(message: str | Warning, stacklevel: int = 4, **kwargs: Any) -> None:
    """`warnings.warn(message, ...)` on global rank 0 only, pointing at the caller."""
    _warn(message, stacklevel=stacklevel, **kwargs)


def rank_zero_deprecation(message: str | Warning, stacklevel: int = 5, **kwargs: Any) -> None:
    """A deprecation warning (TandemDeprecationWarning unless `category` is given) on global rank 0 only."""
    category = kwargs.pop("category", TandemDeprecationWarning)
    rank_zero_warn(message, stacklevel=stacklevel, category=category, **kwargs)


def _log(level: int, *args: Any, stacklevel: int = 2, **kwargs: Any) -> None:
    log.log(level, *args, stacklevel=stacklevel, **kwargs)


def _warn(message: str | Warning, stacklevel: int = 2, **kwargs: Any) -> None:
    warnings.warn(message, stacklevel=stacklevel, **kwargs)
