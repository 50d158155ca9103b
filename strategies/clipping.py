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
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from tandem_core.errors import ConfigError


def clip_gradients(optimizer: torch.optim.Optimizer, clip_val: float, algorithm: str | None = "norm") -> None:
    """Clip the gradients of the optimizer's parameters by total norm (also for None) or by value."""
    algorithm = algorithm or "norm"
    params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    if algorithm == "norm":
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
    for g in groups:
        device = g[0].grad.device  # type: ignore[union-attr]
        torch.nn.utils.clip_grads_with_norm_(g, max_norm, total.to(device))
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
