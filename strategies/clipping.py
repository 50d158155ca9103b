"""Gradient clipping of an optimizer's parameters, by total norm or by value (Trainer's gradient_clip_val), that
also works on tensor-parallel and 2-D (FSDP x TP) models.

torch's ``clip_grad_norm_`` computes every gradient's norm in one foreach op and stacks them: on a model
whose gradients are plain tensors and DTensors (TP leaves some modules whole) it fails with "mixed
torch.Tensor and DTensor", and on a 2-D model (parameters on the (dp, tp) mesh next to parameters sharded on
the dp mesh only) with "must have the same mesh". Here the gradients are grouped by mesh (plain tensors are a
group of their own), each group's norm is taken by torch's ``get_total_norm`` and made whole with
``full_tensor()`` (a collective: every rank calls it), the group norms are combined in float64, and each
group is clipped by ``clip_grads_with_norm_`` with the one global norm. The global norm then equals the norm
of the same gradients in one process. With a single group (a plain model, or FSDP's one mesh) torch's own
functions run, unchanged.

Where the ranks hold disjoint parts of the model (pipeline stages: `strategy.grad_norm_group`), each rank sums
the p-th powers of its own gradients (their local shards under FSDP) in float64, one all-reduce over that group
adds them up, and every rank clips its gradients by the one global norm, as torch's clip_grad_norm_ would in
one process holding them all.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch

from tandem_core.errors import ConfigError


def clip_gradients(
    optimizer: torch.optim.Optimizer, clip_val: float, algorithm: str | None = "norm", norm_group: Any = None
) -> None:
    """Clip the gradients of the optimizer's parameters by total norm (also for None) or by value;
    `norm_group`: the process group over which the ranks hold disjoint parts of the model (pipeline)."""
    algorithm = algorithm or "norm"
    params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    if algorithm == "norm" and norm_group is not None:
        clip_grad_norm_partitioned(params, clip_val, norm_group)
    elif algorithm == "norm":
        clip_grad_norm(params, clip_val)  # torch's, or by mesh on TP / 2-D models
    elif algorithm == "value":
        clip_grad_value(params, clip_val)
    else:
        raise ConfigError(f"gradient_clip_algorithm must be 'norm' or 'value', got {algorithm!r}")


def _groups(params: Iterable[torch.Tensor]) -> list[list[torch.Tensor]]:
    """Parameters with a gradient, grouped by the device mesh of their gradient (None: plain tensors)."""
    from torch.distributed.tensor import DTensor

    groups: dict[object, list[torch.Tensor]] = {}
    for p in params:
        if p.grad is None:
            continue
        key = p.grad.device_mesh if isinstance(p.grad, DTensor) else None
        groups.setdefault(key, []).append(p)
    return list(groups.values())


def _whole(norm: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return norm.full_tensor() if isinstance(norm, DTensor) else norm


def clip_grad_norm(params: Iterable[torch.Tensor], max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
    """Clip the gradients of `params` in place by their total `norm_type` norm; return that norm (float64 when
    the gradients live on several meshes, else torch's own result)."""
    params = list(params)
    groups = _groups(params)
    if len(groups) <= 1:
        return torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type)
    norms = [
        _whole(torch.nn.utils.get_total_norm([p.grad for p in g], norm_type)).to(torch.float64)
        for g in groups
    ]
    # combined where the first group's norm lies (the GPU: no read on the host, no sync)
    stacked = torch.stack([n.to(norms[0].device) for n in norms])
    p = float(norm_type)
    total = stacked.max() if math.isinf(p) else stacked.pow(p).sum().pow(1.0 / p)
    # each group scaled on its local tensors: torch's clip_grads_with_norm_ multiplies DTensor gradients by a plain
    # tensor in one foreach op, which DTensor refuses on CUDA ("mixed torch.Tensor and DTensor")
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)  # torch's clip_grads_with_norm_
    with torch.no_grad():
        for g in groups:
            local = [_local(q.grad) for q in g]
            torch._foreach_mul_(local, coef.to(local[0].device))
    return total


def _local(grad: Any) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return grad.to_local() if isinstance(grad, DTensor) else grad


def clip_grad_norm_partitioned(
    params: Iterable[torch.Tensor], max_norm: float, group: Any, norm_type: float = 2.0
) -> torch.Tensor:
    """Clip `params`' gradients by the norm of all ranks' gradients in `group` together (each rank holds its
    own part of the model); one all-reduce; returns that norm (float64)."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    grads = [
        p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad for p in params if p.grad is not None
    ]
    device = grads[0].device if grads else torch.device("cpu")
    p = float(norm_type)
    if math.isinf(p):
        local = max(
            (g.detach().abs().max().double() for g in grads), default=torch.zeros((), dtype=torch.float64)
        )
        total = local.to(device).reshape(1)
        dist.all_reduce(total, op=dist.ReduceOp.MAX, group=group)
    else:
        total = torch.zeros(1, dtype=torch.float64, device=device)
        for g in grads:
            total += g.detach().double().abs().pow(p).sum()
        dist.all_reduce(total, group=group)
        total = total.pow(1.0 / p)
    total = total[0]
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)  # torch's clip_grads_with_norm_
    with torch.no_grad():
        for g in grads:
            g.mul_(coef.to(g.device))
    return total


def clip_grad_value(params: Iterable[torch.Tensor], clip_value: float) -> None:
    """Clamp every gradient of `params` to [-clip_value, clip_value], one mesh group at a time."""
    params = list(params)
    groups = _groups(params)
    if len(groups) <= 1:
        torch.nn.utils.clip_grad_value_(params, clip_value)
        return
    for g in groups:
        torch.nn.utils.clip_grad_value_(g, clip_value)
