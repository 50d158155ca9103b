"""What Lightning checks of each loader when a stage takes it: that it can be iterated (a TypeError naming where
it came from, before anything runs), and its worker settings (Lightning's three warnings)."""

from __future__ import annotations

import multiprocessing as mp
from typing import TYPE_CHECKING, Any

from torch.utils.data import DataLoader

from tandem_core.rank_zero import rank_zero_warn
from trainer.utilities.data import suggested_max_num_workers
from trainer.utilities.enums import PossibleUserWarning

if TYPE_CHECKING:
    from trainer.loop.session import Session

_ARG = {
    "train": "train_dataloaders",
    "val": "val_dataloaders",
}  # fit's arguments; the other stages' `dataloaders`


def check_loader(session: Session, phase: str, loader: Any) -> None:
    """Raise TypeError for a loader that cannot be iterated; warn as Lightning about its workers."""
    if not isinstance(loader, DataLoader):
        if not (hasattr(type(loader), "__iter__") or hasattr(type(loader), "__getitem__")):
            raise TypeError(f"{_origin(session, phase)}: found {loader!r}, which cannot be iterated; give a "
                            "DataLoader or another iterable of batches.")  # fmt: skip
        return
    _check_workers(session.t, loader, f"{phase}_dataloader")


def _origin(session: Session, phase: str) -> str:
    """Lightning's words for where the loader came from: an argument of the stage, or a *_dataloader method."""
    given = session.train if phase == "train" else session.evals
    if given is not None:
        arg = _ARG[phase] if session.stage == "fit" else "dataloaders"
        return f"An invalid dataloader was passed to `Trainer.{session.stage}({arg}=...)`"
    name = f"{phase}_dataloader"
    owner = next(o for o in (session.dm, session.task) if _defines(o, name))
    return f"An invalid dataloader was returned from `{type(owner).__name__}.{name}()`"


def _defines(owner: Any, name: str) -> bool:
    """Whether `owner` has its own `name` method (not Tandem's default, which only raises)."""
    fn = getattr(owner, name, None) if owner is not None else None
    return callable(fn) and not getattr(fn, "_tandem_default", False)


def _check_workers(t: Any, loader: DataLoader, name: str) -> None:
    """Lightning's warnings about a loader's workers: a spawned worker started anew each epoch, too few workers
    for the CPUs this process may use, and pinned memory with persistent workers and reloaded loaders."""
    context = loader.multiprocessing_context
    method = context.get_start_method() if context is not None else mp.get_start_method()
    upper = suggested_max_num_workers(t.num_devices)
    if loader.num_workers > 0 and method == "spawn" and not loader.persistent_workers:
        rank_zero_warn(
            f"Consider setting `persistent_workers=True` in '{name}': without it each epoch starts its "
            f"{loader.num_workers} worker(s) anew, and under the 'spawn' start method each one imports the script again."
        )
    elif loader.num_workers < 2 and upper > 1:  # (Lightning's docs filter on "does not have many workers")
        rank_zero_warn(
            f"The '{name}' does not have many workers ({loader.num_workers}) which may be a bottleneck: this "
            f"process may use {upper} for loading. Consider increasing the value of the `num_workers` argument "
            f"of its DataLoader to num_workers={upper}.",
            category=PossibleUserWarning,
        )
    if loader.persistent_workers and loader.pin_memory and t.config.reload_dataloaders_every_n_epochs > 0:
        rank_zero_warn(
            f"'{name}' has `pin_memory=True` and `persistent_workers=True` while the Trainer reloads its loaders "
            "(`reload_dataloaders_every_n_epochs > 0`): a combination that can make the workers unstable (a "
            "PyTorch limitation, https://github.com/pytorch/pytorch/issues/91252). Set `pin_memory=False`.",
            category=PossibleUserWarning,
        )
