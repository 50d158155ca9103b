"""What a checkpoint file may hold: plain data that `torch.load(weights_only=True)` reads without running
code. Hyperparameters that are not plain data (a `functools.partial` of an optimizer class, a class) are
stored as import paths in the config layer's `_target_` form and rebuilt, never called, on load."""

from __future__ import annotations

import functools
import os
import pickle
import re
import sys
from typing import Any

import torch

from trainer.errors import CheckpointError

TARGET, PARTIAL, ARGS, NOT_SAVED = "_target_", "_partial_", "_args_", "_not_saved_"
_PLAIN = (type(None), bool, int, float, str, torch.Tensor, torch.dtype, torch.device, torch.Size)


def encode(value: Any, where: str = "hparams") -> Any:
    """`value` as plain data: containers and scalars as they are, partials and classes as `_target_` dicts."""
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, (list, tuple)):
        return type(value)(encode(v, f"{where}[{i}]") for i, v in enumerate(value))
    if isinstance(value, dict):
        return {k: encode(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, functools.partial):
        out = {TARGET: _path(value.func, where), PARTIAL: True}
        if value.args:
            out[ARGS] = [encode(a, where) for a in value.args]
        out.update({k: encode(v, f"{where}.{k}") for k, v in value.keywords.items()})
        return out
    if isinstance(value, type) or callable(value) and hasattr(value, "__qualname__"):
        return {TARGET: _path(value, where), PARTIAL: True}
    return {NOT_SAVED: f"{type(value).__name__} (not plain data: pass it to load_from_checkpoint by name)"}


def missing(hparams: dict[str, Any]) -> dict[str, str]:
    """The top-level hyperparameters that were not plain data and so were not saved: name -> what they were."""
    return {k: v[NOT_SAVED] for k, v in hparams.items() if isinstance(v, dict) and NOT_SAVED in v}


def _path(obj: Any, where: str) -> str:
    path = f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', '')}"
    if "<" in path or path.startswith("."):
        raise CheckpointError(
            f"{where} holds {obj!r}, which has no import path; use a module-level class or function."
        )
    return path


def decode(value: Any) -> Any:
    """Rebuild what `encode` wrote: `_target_` dicts become functools.partial objects (nothing is called)."""
    if isinstance(value, list):
        return [decode(v) for v in value]
    if isinstance(value, tuple):
        return tuple(decode(v) for v in value)
    if isinstance(value, dict):
        if value.get(PARTIAL) is True and isinstance(value.get(TARGET), str):
            kwargs = {k: decode(v) for k, v in value.items() if k not in (TARGET, PARTIAL, ARGS)}
            return functools.partial(resolve_loaded(value[TARGET]), *decode(value.get(ARGS, [])), **kwargs)
        return {k: decode(v) for k, v in value.items()}
    return value


def resolve_loaded(path: str) -> Any:
    """The object at `path` in a module that is already imported: a checkpoint never imports new code."""
    module_name, _, name = path.rpartition(".")
    while module_name and module_name not in sys.modules:
        module_name, _, head = module_name.rpartition(".")
        name = f"{head}.{name}"
    if not module_name:
        raise CheckpointError(
            f"the checkpoint's hyperparameters name {path!r}, whose module is not imported; import it yourself "
            "first (a checkpoint never imports modules), or pass the value to load_from_checkpoint."
        )
    obj: Any = sys.modules[module_name]
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def read(
    path: str, map_location: Any = "cpu", weights_only: bool = True, mmap: bool = False
) -> dict[str, Any]:
    """torch.load with weights_only=True; a file that needs more is a CheckpointError naming the global."""
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
            "or load it with Task.load_from_checkpoint(path, weights_only=False) (never for files you did not "
            "write).",
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
