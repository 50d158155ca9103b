"""Lightning's ``lightning.pytorch.plugins.layer_sync`` under Tandem (strategies/layer_sync.py)."""

from __future__ import annotations

from strategies.layer_sync import LayerSync, TorchSyncBatchNorm

__all__ = ["LayerSync", "TorchSyncBatchNorm"]
