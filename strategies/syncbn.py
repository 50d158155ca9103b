"""sync_batchnorm: BatchNorm statistics over the whole global batch (every process), on any device.

On CUDA this is torch's own SyncBatchNorm. torch's only runs on accelerators, so on the CPU (gloo) the
layers become `GroupBatchNorm`, which computes the same statistics with torch.distributed's
differentiable all-reduce (`_SumAcrossRanks`), letting autograd derive the backward.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from strategies.comm_device import to_comm


class _SumAcrossRanks(torch.autograd.Function):
    """Sum over ranks; the gradient of every rank's input is the sum of every rank's output gradient. The
    sums travel on the communication device `device` (the input's own under gloo: no copy)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, device: torch.device | None) -> torch.Tensor:
        ctx.device = device or x.device
        out = to_comm(x, ctx.device, copy=True)
        dist.all_reduce(out)
        return out.to(x.device)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        out = to_comm(grad, ctx.device, copy=True)
        dist.all_reduce(out)
        return out.to(grad.device), None


class GroupBatchNorm(nn.modules.batchnorm._BatchNorm):
    """BatchNorm whose training-mode mean and variance are taken over every process's batch."""

    comm_device: torch.device | None = None  # where the sums travel (the strategy's; None: the input's)

    def _check_input_dim(self, x: torch.Tensor) -> None:
        if x.dim() < 2:
            raise ValueError(f"expected at least 2-D input (got {x.dim()}-D)")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (
            self.training and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        ):
            return super().forward(x)

        def all_reduce(t: torch.Tensor) -> torch.Tensor:
            return _SumAcrossRanks.apply(t, self.comm_device)

        dims = [0, *range(2, x.dim())]
        count = torch.tensor([x.numel() / x.shape[1]], dtype=x.dtype, device=x.device)
        total = all_reduce(torch.cat([x.sum(dims), count]))
        n = total[-1]
        mean = total[:-1] / n
        shape = [1, -1] + [1] * (x.dim() - 2)
        centred = x - mean.view(shape)
        var = all_reduce(centred.pow(2).sum(dims)) / n
        if self.track_running_stats and self.running_mean is not None and self.running_var is not None:
            with torch.no_grad():
                self.num_batches_tracked.add_(1)
                m = self.momentum if self.momentum is not None else 1.0 / float(self.num_batches_tracked)
                self.running_mean.mul_(1 - m).add_(mean.detach(), alpha=m)
                self.running_var.mul_(1 - m).add_(var.detach() * n / max(float(n) - 1, 1.0), alpha=m)
        out = centred / torch.sqrt(var.view(shape) + self.eps)
        if self.affine:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        return out


def convert_sync_batchnorm(
    module: nn.Module, device: torch.device, comm_device: torch.device | None = None
) -> nn.Module:
    """Every BatchNorm layer of `module` as a synchronised one (torch's on CUDA, GroupBatchNorm elsewhere,
    whose sums travel on `comm_device`)."""
    if device.type == "cuda":
        return nn.SyncBatchNorm.convert_sync_batchnorm(module)
    return _convert(module, comm_device)


def _convert(module: nn.Module, comm_device: torch.device | None) -> nn.Module:
    out = module
    if isinstance(module, nn.modules.batchnorm._BatchNorm) and not isinstance(module, GroupBatchNorm):
        out = GroupBatchNorm(
            module.num_features, module.eps, module.momentum, module.affine, module.track_running_stats
        )
        out.comm_device = comm_device
        if module.affine:
            with torch.no_grad():
                out.weight.copy_(module.weight)
                out.bias.copy_(module.bias)
        out.running_mean, out.running_var = module.running_mean, module.running_var
        out.num_batches_tracked = module.num_batches_tracked
        out.train(module.training)
    for name, child in module.named_children():
        out.add_module(name, _convert(child, comm_device))
    return out
