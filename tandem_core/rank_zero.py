"""`rank_zero_only`: run a function on global rank 0 only (Lightning's utility of the same name)."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def _global_rank() -> int:
    for var in ("RANK", "SLURM_PROCID"):  # set for every worker before the user's code runs
        if var in os.environ:
            return int(os.environ[var])
    return 0


def rank_zero_only(fn: F) -> F:
    """Decorate `fn` so that it runs on global rank 0 and returns None elsewhere. Example::

    @rank_zero_only
    def log_samples(self): ...
    """

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs) if _global_rank() == 0 else None

    return wrapped  # type: ignore[return-value]
