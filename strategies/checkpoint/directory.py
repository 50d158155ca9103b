"""The directory form of a checkpoint (torch.distributed.checkpoint): every rank writes its own shards of
the weights and optimizer states, rank 0 adds ``tandem.pt`` with everything else, under a temporary name
renamed into place once every rank has finished. Read as plain data through strategies/checkpoint/dcp_read.py,
resharded to the task as it is now (any world size). strategies/checkpoint/io.py chooses between the forms."""

from __future__ import annotations

import glob
import os
import shutil
import uuid
from typing import TYPE_CHECKING, Any

import torch

from strategies.checkpoint.checks import (
    _check_count,
    check_compatible,
    check_contents,
    regular_file,
    resumable,
)
from strategies.checkpoint.files import atomic_save, read
from tandem_core.errors import CheckpointError

if TYPE_CHECKING:
    from strategies.comm import Comm

META = "tandem.pt"  # a directory checkpoint's non-tensor part
MODEL = "model/"  # key prefix of the weights in a directory checkpoint; optimizer i's is f"optim{i}/"
TENSOR_KEYS = ("state_dict", "optimizer_states")


def write_dir(tensors: dict[str, Any], meta: dict[str, Any], path: str, comm: Comm) -> None:
    """Write a directory checkpoint: `tensors` (flat, DTensors or tensors) with DCP by every rank, `meta`
    by rank 0, all under a temporary name that replaces `path` once every rank has finished."""
    import torch.distributed.checkpoint as dcp

    path = os.path.abspath(path)
    tmp = temp_dir(path, comm)
    comm.barrier("save_checkpoint")
    dcp.save(tensors, checkpoint_id=tmp)
    comm.barrier("save_checkpoint")
    if comm.is_global_zero:
        publish_dir(tmp, meta, path)
    comm.barrier("save_checkpoint")


def temp_dir(path: str, comm: Comm) -> str:
    """The temporary name a directory checkpoint of `path` is written under, the same on every rank; rank 0
    deletes what saves of `path` that crashed left (never the new name)."""
    path = os.path.abspath(path)
    tmp = comm.broadcast(f"{path}.tmp-{uuid.uuid4().hex[:12]}")  # one name for every rank
    if comm.is_global_zero:
        for stale in glob.glob(glob.escape(path) + ".tmp-*"):  # left by a save that crashed
            if stale != tmp:
                shutil.rmtree(stale, ignore_errors=True)
    return tmp


def publish_dir(tmp: str, meta: dict[str, Any], path: str) -> None:
    """Rank 0, once every rank's shards and DCP's metadata are in `tmp`: add `meta` (tandem.pt) and rename
    `tmp` to `path`, so that `path` is only ever a complete checkpoint."""
    atomic_save(meta, os.path.join(tmp, META))
    _swap_in(tmp, path)


def _swap_in(tmp: str, path: str) -> None:
    """Rename `tmp` to `path`; an existing `path` is moved aside first and deleted only afterwards (a crash
    between the two renames leaves it as `path`.old-*, which reading falls back to)."""
    old = None
    if os.path.lexists(path):
        old = f"{path}.old-{uuid.uuid4().hex[:12]}"
        os.rename(path, old)
    os.rename(tmp, path)
    fd = os.open(os.path.dirname(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    if old is not None:
        _delete(old, path)


def discard(path: str) -> None:
    """Delete a checkpoint (a file, or a directory of shards) so that a kill midway never leaves part of a
    directory under a checkpoint's name. Copies a crash left moved aside (`path`.old-*) go first, so that
    reading a deleted checkpoint never falls back to an older copy."""
    for p in [*glob.glob(glob.escape(path) + ".old-*"), path]:
        _delete(p, path)


def _delete(p: str, name: str) -> None:
    """Delete `p`, a file or a copy of checkpoint `name`: a directory renamed to a temporary name of `name`
    first (which the next save of `name` clears) and deleted from there."""
    if os.path.isdir(p) and not os.path.islink(p):
        gone = f"{name}.tmp-{uuid.uuid4().hex[:12]}"
        os.rename(p, gone)
        shutil.rmtree(gone)
    elif os.path.lexists(p):
        os.remove(p)


def _existing(path: str) -> str:
    """`path`, or the copy a save moved aside when it crashed before renaming the new one in."""
    if os.path.exists(path):
        return path
    aside = sorted(glob.glob(glob.escape(path) + ".old-*"), key=os.path.getmtime)
    return aside[-1] if aside else path


def _read_meta(path: str) -> tuple[dict[str, Any], Any]:
    """The non-tensor part and the DCP metadata of a directory checkpoint."""
    from strategies.checkpoint import dcp_read

    try:
        regular_file(os.path.join(path, META), "checkpoint part", follow=False)
        meta = read(os.path.join(path, META), "cpu")
        metadata = dcp_read.read_metadata(path)  # its declared sizes checked against the files
    except CheckpointError:
        raise
    except Exception as e:
        raise CheckpointError(
            f"{path!r} is not a complete Tandem checkpoint directory ({type(e).__name__}: {e})."
        ) from e
    check_contents(meta, path, directory=True)
    return meta, metadata


def _saved_weights(metadata: Any) -> dict[str, torch.Tensor]:
    """The saved weights as empty tensors of their full shape and dtype, on the meta device."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    return {
        k[len(MODEL) :]: torch.empty(md.size, dtype=md.properties.dtype, device="meta")
        for k, md in metadata.state_dict_metadata.items()
        if k.startswith(MODEL) and isinstance(md, TensorStorageMetadata)
    }


def read_dir(path: str) -> dict[str, Any]:
    """A directory checkpoint with its weights gathered whole into this process (no collectives)."""
    from strategies.checkpoint import dcp_read

    meta, metadata = _read_meta(path)
    target = {MODEL + k: torch.empty(v.shape, dtype=v.dtype) for k, v in _saved_weights(metadata).items()}
    target.update({k: None for k in metadata.state_dict_metadata if k.startswith(MODEL) and k not in target})
    dcp_read.load(target, path, no_dist=True)
    meta["state_dict"] = {k[len(MODEL) :]: v for k, v in target.items()}
    return meta


def restore_dir(
    path: str, task: torch.nn.Module, optimizers: list[torch.optim.Optimizer] | None, weights: bool = True
) -> dict[str, Any]:
    """Load a directory checkpoint into the task as it is now (sharded or whole, any world size) and,
    for a full checkpoint, into `optimizers`; every rank calls this."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    from strategies.checkpoint import dcp_read

    meta, metadata = _read_meta(path)
    if weights:
        check_compatible(task, _saved_weights(metadata), path)
    optimizers = optimizers if resumable(meta) else None
    if optimizers is not None:
        _check_count(path, int(meta.get("optimizers", 0)), optimizers)
    model, optims = sharded_states(task, optimizers)
    target = {
        **(_prefixed(MODEL, model) if weights else {}),
        **{k: v for i, o in enumerate(optims) for k, v in _prefixed(f"optim{i}/", o).items()},
    }
    dcp_read.load(target, path, no_dist=not torch.distributed.is_initialized())
    model = _unprefixed(MODEL, target) if weights else model
    if weights:
        set_model_state_dict(task, model)
    for i, opt in enumerate(optimizers or []):
        set_optimizer_state_dict(task, opt, _unprefixed(f"optim{i}/", target), options=_flat())
    meta["state_dict"] = model
    return meta


def sharded_states(
    task: torch.nn.Module, optimizers: list[torch.optim.Optimizer] | None
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The task's weights and each optimizer's state keyed by parameter name, as this rank holds them
    (DTensor shards under FSDP), in the flat form a directory checkpoint stores."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    model = get_model_state_dict(task)
    return model, [get_optimizer_state_dict(task, o, options=_flat()) for o in optimizers or []]


def dir_payload(ckpt: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split a checkpoint dict of sharded states into DCP's flat tensors and rank 0's `meta` part."""
    tensors = _prefixed(MODEL, ckpt["state_dict"])
    for i, state in enumerate(ckpt.get("optimizer_states", [])):
        tensors.update(_prefixed(f"optim{i}/", state))
    meta = {k: v for k, v in ckpt.items() if k not in TENSOR_KEYS}
    meta["optimizers"] = len(ckpt.get("optimizer_states", []))
    return tensors, meta


def _options(**kwargs: bool) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(**kwargs)


def _flat() -> Any:
    return _options(flatten_optimizer_state_dict=True)


def _prefixed(prefix: str, state: dict[str, Any]) -> dict[str, Any]:
    return {prefix + k: v for k, v in state.items()}


def _unprefixed(prefix: str, state: dict[str, Any]) -> dict[str, Any]:
    return {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
