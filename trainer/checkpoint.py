"""Checkpoint files: atomic writes and checked reads."""

from __future__ import annotations

import os
from typing import Any

import torch

from trainer.errors import CheckpointError
from trainer.fileio import atomic_write


def atomic_save(obj: Any, path: str | os.PathLike[str]) -> None:
    """torch.save `obj` to `path` through atomic_write: a crash leaves either the old file or the new one."""
    atomic_write(path, lambda f: torch.save(obj, f))


def load(path: str | os.PathLike[str], map_location: Any = "cpu") -> dict[str, Any]:
    """Read a checkpoint written by Trainer.save_checkpoint."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise CheckpointError(
            f"checkpoint {path!r} does not exist; pass an existing file or ckpt_path='last'."
        )
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=False)
    except Exception as e:
        raise CheckpointError(f"checkpoint {path!r} could not be read ({type(e).__name__}: {e}).") from e
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt:
        raise CheckpointError(
            f"{path!r} is not a Tandem checkpoint (no 'state_dict'); save one with trainer.save_checkpoint."
        )
    return ckpt


def check_compatible(model: torch.nn.Module, state_dict: dict[str, torch.Tensor], path: str) -> None:
    """Raise CheckpointError listing what differs when the checkpoint belongs to another model."""
    own = model.state_dict()
    missing = [k for k in own if k not in state_dict]
    unexpected = [k for k in state_dict if k not in own]
    mismatched = [
        f"{k}: checkpoint {tuple(state_dict[k].shape)} vs model {tuple(v.shape)}"
        for k, v in own.items()
        if k in state_dict and isinstance(v, torch.Tensor) and tuple(state_dict[k].shape) != tuple(v.shape)
    ]
    if missing or unexpected or mismatched:
        parts = []
        if missing:
            parts.append(f"missing keys {missing[:5]}{' ...' if len(missing) > 5 else ''}")
        if unexpected:
            parts.append(f"unexpected keys {unexpected[:5]}{' ...' if len(unexpected) > 5 else ''}")
        if mismatched:
            parts.append(f"shape mismatches {mismatched[:5]}")
        raise CheckpointError(
            f"checkpoint {path!r} was saved from a different model: "
            + "; ".join(parts)
            + ". Load it into the model it was saved from, or start without ckpt_path."
        )
