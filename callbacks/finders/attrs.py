"""Where a tuned value lives: an attribute of the task, its hparams, the datamodule or the datamodule's hparams
(Lightning's lightning_hasattr / lightning_getattr / lightning_setattr)."""

from __future__ import annotations

from typing import Any


def holders(task: Any, name: str) -> list[Any]:
    """Every object or dict that has `name`, in Lightning's order."""
    found: list[Any] = []
    if hasattr(task, name):
        found.append(task)
    hparams = getattr(task, "hparams", None)
    if hparams is not None and name in hparams:
        found.append(hparams)
    trainer = getattr(task, "_trainer", None)
    dm = getattr(trainer, "datamodule", None) if trainer is not None else None
    if dm is not None:
        if hasattr(dm, name):
            found.append(dm)
        dm_hparams = getattr(dm, "hparams", None)
        if dm_hparams is not None and name in dm_hparams:
            found.append(dm_hparams)
    return found


def has(task: Any, name: str) -> bool:
    return bool(holders(task, name))


def get(task: Any, name: str) -> Any:
    """The value from the last holder (Lightning reads the last one found)."""
    found = holders(task, name)
    if not found:
        raise AttributeError(
            f"{name!r} is neither an attribute nor a hyperparameter of the task or the datamodule."
        )
    last = found[-1]
    return last[name] if isinstance(last, dict) else getattr(last, name)


def set_everywhere(task: Any, name: str, value: Any) -> None:
    """Set `name` in every holder, so that whatever reads it (a *_dataloader(), configure_optimizers) sees it."""
    found = holders(task, name)
    if not found:
        raise AttributeError(
            f"{name!r} is neither an attribute nor a hyperparameter of the task or the datamodule."
        )
    for holder in found:
        if isinstance(holder, dict):
            holder[name] = value
        else:
            setattr(holder, name, value)
