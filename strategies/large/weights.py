"""Full weights into a model that no rank holds whole: read once, by rank 0, memory-mapped; sent tensor by
tensor; each rank keeps its shard.

A file is opened memory-mapped on every rank (``torch.load(mmap=True)``: only its records' metadata are
read; a tensor's bytes are read when touched), but only rank 0 touches the tensors. Each tensor goes out in
one broadcast, and every other rank copies its shard out of it and drops it, so no rank other than the
reader ever holds more than its shard and one whole tensor. Sharded models (fsdp, model_parallel) load
through torch's ``set_model_state_dict(..., full_state_dict=True, broadcast_from_rank0=True)``; a pipeline
rank, which holds only its stages (the others are on the meta device), through `broadcast_into`.

Weights a task asks for before it is set up (a model built on the meta device by ``load_from_checkpoint`` or
``load_pretrained`` inside ``Trainer.init_module(empty_init=True)``) wait on the task (`defer`) and are loaded
by the strategy right after it materialized the shards.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from strategies.checkpoint.checks import check_compatible
from strategies.checkpoint.files import read
from tandem_core.errors import CheckpointError

#: what to do when a weights file does not fit the task (check_compatible's advice)
REMEDY = "Load the weights of this model, or pass strict=False to load the names they share."
_ATTR = "_tandem_pending_weights"
_EXPECTED = "_tandem_expected_weights"


@dataclass
class PendingWeights:
    """Weights a task will get at setup: `state_dict` (memory-mapped tensors: nothing read yet)."""

    state_dict: dict[str, Any]
    strict: bool
    source: str


def read_weights(path: str | os.PathLike[str], key: str | None = "auto") -> dict[str, Any]:
    """The tensors of a weights file, memory-mapped, read as plain data (Tandem's safe reading): a state dict
    saved with ``torch.save(model.state_dict())``, or the ``"state_dict"`` of a checkpoint (key="auto")."""
    path = os.fspath(path)
    data = read(path, map_location="cpu", weights_only=True, mmap=True)
    if key == "auto":
        key = "state_dict" if isinstance(data, dict) and isinstance(data.get("state_dict"), dict) else None
    if key is not None:
        data = data.get(key) if isinstance(data, dict) else None
    if not isinstance(data, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in data.items()
    ):
        raise CheckpointError(
            f"{path!r} holds no state dict (a mapping of parameter and buffer names to tensors"
            f"{'' if key is None else f' under {key!r}'}); save one with torch.save(model.state_dict(), path)."
        )
    return data


def defer(task: nn.Module, state_dict: dict[str, Any], strict: bool, source: str) -> None:
    """Keep `state_dict` on the task until its strategy has materialized it (then `load_pending`)."""
    task.__dict__[_ATTR] = PendingWeights(state_dict, strict, source)


def pending(task: nn.Module) -> PendingWeights | None:
    """The weights waiting on `task`, if any."""
    return task.__dict__.get(_ATTR)


def take(task: nn.Module) -> PendingWeights | None:
    """The weights waiting on `task`, no longer waiting."""
    return task.__dict__.pop(_ATTR, None)


def expect(task: nn.Module, names: set[str]) -> None:
    """Say that a restore right after setup fills `names` (fit(ckpt_path=...)): their modules need no
    reset_parameters when materialized."""
    task.__dict__[_EXPECTED] = set(names)


def covered(task: nn.Module) -> set[str]:
    """The names the waiting or expected weights will fill (their modules need no reset_parameters); the
    expectation is used up by this call."""
    found = pending(task)
    names = set(found.state_dict) if found is not None else set()
    return names | task.__dict__.pop(_EXPECTED, set())


def load_pending(task: nn.Module, sharded: bool, reader: bool) -> bool:
    """Load the weights waiting on `task` (if any) and drop them; `sharded`: through a broadcast from the
    reader (every rank calls this), else each rank from its own memory map. Returns whether any loaded."""
    found = take(task)
    if found is None:
        return False
    if found.strict:
        check_compatible(task, found.state_dict, found.source, REMEDY)
    if sharded:
        load_full(task, found.state_dict if reader else {}, found.strict)
    else:
        with torch.no_grad():
            task.load_state_dict(found.state_dict, strict=found.strict)
    return True


def load_full(task: nn.Module, state_dict: dict[str, Any], strict: bool = True) -> None:
    """Rank 0's whole `state_dict` into the sharded `task` (the other ranks pass {}): torch's broadcast from
    rank 0, one tensor at a time, each rank keeping its shard."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=strict)
    set_model_state_dict(task, state_dict, options=options)


def broadcast_into(
    task: nn.Module, state_dict: dict[str, Any], strict: bool = True, device: torch.device | None = None
) -> None:
    """Rank 0's whole `state_dict` into a task of which each rank holds only some modules (the rest on the
    meta device; a held module may be sharded by fully_shard): every tensor is broadcast to every rank, and
    the ranks that hold it copy their part. Every rank calls this; the others pass {}. `device`: where the
    broadcast runs (the GPU under NCCL; None: the CPU)."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor, distribute_tensor

    own = task.state_dict(keep_vars=True)
    names = [list(state_dict)] if dist.get_rank() == 0 else [None]
    dist.broadcast_object_list(names, src=0)
    if strict:
        missing = [k for k in own if k not in set(names[0])]
        if missing:
            raise CheckpointError(
                f"the weights lack {missing[:5]}; pass strict=False to keep their own values."
            )
    for name in names[0]:
        info = [(tuple(state_dict[name].shape), state_dict[name].dtype)] if dist.get_rank() == 0 else [None]
        dist.broadcast_object_list(info, src=0)
        shape, dtype = info[0]
        target = own.get(name)
        where = device or torch.device("cpu")
        full = (
            state_dict[name].to(where)
            if dist.get_rank() == 0
            else torch.empty(shape, dtype=dtype, device=where)
        )
        dist.broadcast(full, src=0)
        if target is None or target.is_meta:
            continue
        with torch.no_grad():
            if isinstance(target, DTensor):
                part = distribute_tensor(full, target.device_mesh, target.placements, src_data_rank=None)
                target.to_local().copy_(part.to_local())
            else:
                target.copy_(full)
        del full
