"""The `dataloader_idx` argument of the evaluation and predict steps and batch hooks, checked when the loop starts
(as Lightning does): a required one with a single loader, or none with several, is an error naming the method."""

from __future__ import annotations

import inspect
from typing import Any

from tandem_core.errors import TaskError


class DataloaderIdxError(TaskError, RuntimeError):
    """A step or batch hook's signature does not match the number of loaders (Lightning raises RuntimeError)."""


def _params(fn: Any) -> dict[str, inspect.Parameter] | None:
    try:
        return dict(inspect.signature(fn).parameters)  # follows functools.wraps' __wrapped__
    except (TypeError, ValueError):  # a builtin or a callable without a signature: nothing to check
        return None


def check_dataloader_idx(task: Any, prefix: str, loaders: int) -> None:
    """Raise DataloaderIdxError where `{prefix}_step` or the task's on_{prefix}_batch_start/end cannot take the
    `dataloader_idx` the loop passes (several loaders) or requires one it will not get (a single loader)."""
    step = f"{prefix}_step"
    names = [f"on_{prefix}_batch_start", f"on_{prefix}_batch_end"]
    step_params = _params(getattr(task, step, None)) if callable(getattr(task, step, None)) else None
    if step_params is not None and "dataloader_iter" not in step_params:
        names.insert(0, step)
    for name in names:
        fn = getattr(task, name, None)
        params = _params(fn) if callable(fn) else None
        if params is None:
            continue
        takes = "dataloader_idx" in params or any(p.kind is p.VAR_POSITIONAL for p in params.values())
        where = f"{type(task).__name__}.{name}()"
        if loaders > 1 and not takes:
            raise DataloaderIdxError(
                f"{where} gets a `dataloader_idx` argument: {loaders} {prefix} loaders were given; add "
                "`dataloader_idx=0` to its signature."
            )
        p = params.get("dataloader_idx")
        if loaders <= 1 and p is not None and p.default is inspect.Parameter.empty:
            raise DataloaderIdxError(
                f"{where} requires `dataloader_idx`, but a single {prefix} loader passes none; give it a "
                "default (`dataloader_idx=0`) or remove it."
            )
