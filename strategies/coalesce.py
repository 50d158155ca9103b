"""Coalesced copies for DataParallel: a task's tensors copied onto the replicas' devices, and the replicas'
gradients summed back, in a few large copies instead of one per parameter.

Across distinct GPUs this is torch's own `torch.nn.parallel.comm.broadcast_coalesced` (what torch's
DataParallel replicates with). Elsewhere (replicas on the CPU, or two replicas on one GPU) the tensors of each
dtype are packed into one flat buffer (one concatenation), copied once per device, and handed out as views.
The gradients go back the same way: each replica's are packed per dtype and copied once onto the source,
where the packs are added, as torch's `reduce_add_coalesced` does between GPUs (it needs one replica on the
destination; here replica 0's gradients reach the source directly, through autograd).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["copies_on", "sum_onto"]


def _by_dtype(tensors: Sequence[torch.Tensor | None]) -> dict[torch.dtype, list[int]]:
    groups: dict[torch.dtype, list[int]] = {}
    for i, t in enumerate(tensors):
        if t is not None:
            groups.setdefault(t.dtype, []).append(i)
    return groups


def copies_on(tensors: Sequence[torch.Tensor], devices: Sequence[torch.device]) -> list[list[torch.Tensor]]:
    """For each of `devices`, copies of `tensors` (all on one device) there, in the tensors' order."""
    if not tensors or not devices:
        return [[] for _ in devices]
    source = tensors[0].device
    out: list[list[torch.Tensor] | None] = [None] * len(devices)
    gpus = [d for d in dict.fromkeys(devices) if d.type == "cuda" and d != source]
    if source.type == "cuda" and gpus:  # torch's broadcast between distinct GPUs (one replica per GPU each)
        from torch.nn.parallel.comm import broadcast_coalesced

        sent = dict(zip(gpus, broadcast_coalesced(list(tensors), [source, *gpus])[1:]))
        for k, d in enumerate(devices):
            if d in sent:
                out[k] = list(sent.pop(d))  # a second replica on the same GPU gets copies of its own below
    rest = [k for k, o in enumerate(out) if o is None]
    if rest:
        groups = _by_dtype(tensors)
        flats = {
            dtype: torch.cat([tensors[i].detach().reshape(-1) for i in idx]) for dtype, idx in groups.items()
        }
        for n, k in enumerate(rest):
            copy: list[torch.Tensor] = [torch.empty(0)] * len(tensors)
            for dtype, idx in groups.items():
                flat = flats[dtype]
                if (
                    n > 0 or devices[k] != source
                ):  # the concatenation is itself a fresh copy: the first on source
                    flat = flat.to(devices[k], copy=True)
                for i, part in zip(idx, flat.split([tensors[i].numel() for i in idx])):
                    copy[i] = part.view_as(tensors[i])
            out[k] = copy
    return out  # type: ignore[return-value]


def sum_onto(
    per_replica: Sequence[Sequence[torch.Tensor | None]], like: Sequence[torch.Tensor], source: torch.device
) -> list[torch.Tensor | None]:
    """Per tensor of `like` (its shape and dtype: a meta tensor will do), the sum on `source` of the replicas'
    gradients (each replica's list in `like`'s order, None where it has none); None where no replica has one."""
    present = [any(grads[i] is not None for grads in per_replica) for i in range(len(like))]
    out: list[torch.Tensor | None] = [None] * len(like)
    for idx in _by_dtype([g if p else None for g, p in zip(like, present)]).values():
        total: torch.Tensor | None = None
        for grads in per_replica:
            here = next((grads[i].device for i in idx if grads[i] is not None), None)
            if here is None:
                continue
            flat = torch.cat(
                [
                    (g if g is not None else like[i].new_zeros(like[i].shape, device=here)).reshape(-1)
                    for i, g in ((i, grads[i]) for i in idx)
                ]
            )
            flat = flat.to(source, non_blocking=source.type == "cuda" and here.type == "cuda")
            total = flat if total is None else total.add_(flat)
        assert total is not None
        for i, part in zip(idx, total.split([like[i].numel() for i in idx])):
            out[i] = part.view_as(like[i])
    return out
