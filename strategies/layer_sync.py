"""Layer synchronization plugins (Lightning's ``LayerSync`` and ``TorchSyncBatchNorm``): how a parallel strategy
makes layers see the whole global batch. ``Trainer(sync_batchnorm=True)`` is ``plugins=[TorchSyncBatchNorm()]``.

TorchSyncBatchNorm converts every BatchNorm layer when a stage sets the task up and converts them back when
it ends: on CUDA into torch's ``SyncBatchNorm``; on other devices (torch's runs on accelerators only) into
strategies/syncbn.py's ``GroupBatchNorm``, which takes the same statistics over every process's batch. A
subclass of ``LayerSync`` does its own conversion::

    class SyncOnlyTheHead(LayerSync):
        def apply(self, model): ...
        def revert(self, model): ...
    Trainer(strategy="ddp", devices=2, plugins=[SyncOnlyTheHead()])
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch import nn

from strategies.syncbn import GroupBatchNorm, convert_sync_batchnorm

__all__ = ["LayerSync", "TorchSyncBatchNorm"]


class LayerSync(ABC):
    """A way to synchronize layers across processes: `apply` when the task is set up, `revert` at the end."""

    @abstractmethod
    def apply(self, model: nn.Module) -> nn.Module:
        """Make the model's layers synchronized (in place; return the model)."""

    @abstractmethod
    def revert(self, model: nn.Module) -> nn.Module:
        """Undo `apply` (in place; return the model)."""


class TorchSyncBatchNorm(LayerSync):
    """Every BatchNorm layer with its statistics over all processes (no effect in one process)."""

    def apply(
        self, model: nn.Module, device: torch.device | None = None, comm_device: torch.device | None = None
    ) -> nn.Module:
        """Convert the BatchNorm layers for `device` (default: where the model's parameters are), their sums
        travelling on `comm_device` (the strategy's communication device; default: the input's)."""
        if device is None:
            first = next(model.parameters(), None)
            device = first.device if first is not None else torch.device("cpu")
        return convert_sync_batchnorm(model, device, comm_device)

    def revert(self, model: nn.Module) -> nn.Module:
        """The synchronized layers back as plain BatchNorm layers with the same weights and statistics."""
        return _revert(model)


class _BatchNormXd(nn.modules.batchnorm._BatchNorm):
    """A BatchNorm of any input rank (what a reverted layer becomes, as in Lightning)."""

    def _check_input_dim(self, x: torch.Tensor) -> None:
        return


def _revert(module: nn.Module) -> nn.Module:
    out = module
    if isinstance(module, (nn.SyncBatchNorm, GroupBatchNorm)):
        out = _BatchNormXd(
            module.num_features, module.eps, module.momentum, module.affine, module.track_running_stats
        )
        if module.affine:
            with torch.no_grad():
                out.weight, out.bias = module.weight, module.bias
        out.running_mean, out.running_var = module.running_mean, module.running_var
        out.num_batches_tracked = module.num_batches_tracked
        out.training = module.training
    for name, child in module.named_children():
        out.add_module(name, _revert(child))
    return out
