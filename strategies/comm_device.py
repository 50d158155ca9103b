"""Where the tensors handed to a collective live: the communication device of a process group.

NCCL takes only CUDA tensors (of the rank's own GPU); gloo takes CPU tensors (and a few CUDA ones, slowly). A
value Tandem builds for a collective (a logged number under sync_dist, an agreement flag, the autotuner's
plan) or receives from a user (a CPU tensor under sync_dist) is moved there by `to_comm`, the one place that
does it; `comm_device` says which device that is for a group, and `barrier` passes NCCL its device. The
strategy decides once, when it joins its group (`ProcessGroupComm.device`), and hands that device to what
it builds (the Reducer, its autotuner, sync_batchnorm's layers); code used without a strategy asks the
group's backend. Model data (parameters, gradient buckets) lives on the rank's device, which is the
communication device wherever NCCL runs (rank i on cuda:i).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

__all__ = ["BROADCAST_CHUNK_BYTES", "barrier", "broadcast_tensors", "comm_device", "to_comm"]


def comm_device(group: Any = None, root: torch.device | None = None) -> torch.device:
    """The device whose tensors `group`'s backend takes: the current CUDA device for NCCL, the CPU for gloo;
    `root` (the rank's device, else the CPU) for a group that takes both ("cpu:gloo,cuda:nccl") or another
    backend."""
    backend = str(dist.get_backend(group)).lower()
    if "nccl" in backend and "gloo" not in backend:
        if root is not None and root.type == "cuda":
            return root
        return torch.device("cuda", torch.cuda.current_device())
    if "gloo" in backend and "nccl" not in backend:
        return torch.device("cpu")
    return root if root is not None else torch.device("cpu")


def to_comm(
    value: Any, device: torch.device, dtype: torch.dtype | None = None, copy: bool = False
) -> torch.Tensor:
    """`value` (a number, a list of numbers or a tensor) as a tensor on `device`, ready for a collective: a
    tensor already there (in `dtype`) is returned as it is unless `copy` (a collective writes into its input).
    Host values are built on the host and copied over; a device-to-host move blocks (it must: the host reads
    it), a host-to-device one does not wait for the device."""
    if isinstance(value, torch.Tensor):
        value = value.detach()
        return value.to(device=device, dtype=dtype, non_blocking=device.type != "cpu", copy=copy)
    return torch.tensor(value, dtype=dtype, device=device)


def barrier(device: torch.device, group: Any = None, **kwargs: Any) -> None:
    """torch.distributed.barrier, naming the device under NCCL: without `device_ids` NCCL guesses one (rank
    modulo GPUs) and may build a communicator on another rank's GPU."""
    if device.type == "cuda" and device.index is not None and "nccl" in str(dist.get_backend(group)).lower():
        kwargs["device_ids"] = [device.index]
    dist.barrier(group=group, **kwargs)


#: tensors are broadcast in messages of at most this many bytes (torch's DDP broadcasts its first parameters in
#: 250 MB chunks too), so that a broadcast never holds a second copy of the whole model on the device
BROADCAST_CHUNK_BYTES = 250 * 1024 * 1024


def broadcast_tensors(
    tensors: list[torch.Tensor],
    src: int,
    group: Any,
    device: torch.device,
    chunk_bytes: int = BROADCAST_CHUNK_BYTES,
) -> None:
    """Broadcast tensors in place from global rank `src` in few messages: those of one dtype are packed into
    flat chunks of at most `chunk_bytes` on the communication `device`; a tensor larger than that goes alone,
    in place when it lies on `device` already."""
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for t in tensors:
        by_dtype.setdefault(t.dtype, []).append(t.detach())
    with torch.no_grad():
        for same_dtype in by_dtype.values():
            chunk: list[torch.Tensor] = []
            size = 0
            for t in same_dtype:
                nbytes = t.numel() * t.element_size()
                if chunk and size + nbytes > chunk_bytes:
                    _broadcast_chunk(chunk, src, group, device)
                    chunk, size = [], 0
                chunk.append(t)
                size += nbytes
            if chunk:
                _broadcast_chunk(chunk, src, group, device)


def _broadcast_chunk(chunk: list[torch.Tensor], src: int, group: Any, device: torch.device) -> None:
    if len(chunk) == 1 and chunk[0].device == device and chunk[0].is_contiguous():
        dist.broadcast(chunk[0], src=src, group=group)
        return
    sizes = [t.numel() for t in chunk]
    flat = torch.empty(sum(sizes), dtype=chunk[0].dtype, device=device)
    for t, part in zip(chunk, flat.split(sizes)):
        part.copy_(t.reshape(-1))
    dist.broadcast(flat, src=src, group=group)
    for t, part in zip(chunk, flat.split(sizes)):
        t.copy_(part.view_as(t))
