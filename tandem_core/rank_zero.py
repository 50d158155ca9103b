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


def rank_zero_only(fn: F, default: Any = None) -> F:
    """Decorate `fn` so that it runs on global rank 0 and returns `default` (None) elsewhere. Example::

    @rank_zero_only
    def log_samples(self): ...

    The rank is read from the environment on each call; `rank_zero_only.rank = r` fixes it (as Lightning's).
    """

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        rank = getattr(rank_zero_only, "rank", None)
        return fn(*args, **kwargs) if (_global_rank() if rank is None else rank) == 0 else default

    return wrapped  # type: ignore[return-value]


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
