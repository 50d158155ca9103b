"""Writing one checkpoint file atomically, and reading one safely: `torch.load(weights_only=True)` after the file's records were checked, and a
refusal that names the global a file needs and says how to trust it."""

from __future__ import annotations

import os
import pickle
import re
from typing import Any

import torch

from strategies.checkpoint.checks import check_file
from tandem_core.errors import CheckpointError
from tandem_core.fileio import atomic_write


def atomic_save(obj: Any, path: str | os.PathLike[str]) -> None:
    """torch.save `obj` to `path` atomically (see tandem_core.fileio.atomic_write). A failed write (a full disk)
    leaves the previous file; torch reports it as a RuntimeError of its zip writer, raised here as a
    CheckpointError that names the file and the system's error."""
    try:
        atomic_write(path, lambda f: torch.save(obj, f))
    except RuntimeError as e:
        cause = e.__cause__ or e.__context__
        if not isinstance(cause, OSError):
            raise
        raise CheckpointError(
            f"could not write checkpoint {os.fspath(path)!r}: {cause}; the previous file there is unchanged."
        ) from e


def read(
    path: str, map_location: Any = "cpu", weights_only: bool = True, mmap: bool = False
) -> dict[str, Any]:
    """torch.load with weights_only=True; a file that needs more is a CheckpointError naming the global."""
    check_file(
        os.fspath(path), weights_only
    )  # a regular file whose records fit in it, before torch allocates
    try:
        return torch.load(path, map_location=map_location, weights_only=weights_only, mmap=mmap)
    except pickle.UnpicklingError as e:
        name = refused_global(e)
        if name is None:
            raise
        raise unsafe(
            f"checkpoint {os.fspath(path)!r}",
            name,
            f"If you trust this file, allow that global first with torch.serialization.add_safe_globals([{name}]), "
            "or read it whole with weights_only=False: Task.load_from_checkpoint(path, weights_only=False), "
            "trainer.fit(..., ckpt_path=path, weights_only=False) (or validate/test/predict); never for files "
            "you did not write.",
        ) from e


def refused_global(e: pickle.UnpicklingError) -> str | None:
    """The global (module.name) that torch.load(weights_only=True) refused, as its error names it."""
    wanted = re.search(r"GLOBAL ([\w.]+)", str(e))
    return None if wanted is None else wanted.group(1)


def unsafe(what: str, name: str, remedy: str) -> CheckpointError:
    """The refusal of `what` (a checkpoint, or a file in one) that needs the global `name` to load."""
    return CheckpointError(
        f"{what} needs {name!r} to load, and loading it could run code from the file; Tandem reads only plain "
        f"data from checkpoints. {remedy}"
    )
