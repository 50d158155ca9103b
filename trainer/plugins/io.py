"""Lightning's checkpoint-IO plugins (lightning.pytorch.plugins.io), which live in strategies/checkpoint/:

from trainer.plugins import AsyncCheckpointIO
Trainer(plugins=[AsyncCheckpointIO()])  # checkpoints written in the background
"""

from __future__ import annotations

from strategies.checkpoint.async_io import AsyncCheckpointIO
from strategies.checkpoint.io import CheckpointIO, TorchCheckpointIO

__all__ = ["AsyncCheckpointIO", "CheckpointIO", "TorchCheckpointIO"]
