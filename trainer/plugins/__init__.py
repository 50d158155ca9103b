"""Lightning's plugins that Tandem takes: the SLURM environment (lightning.pytorch.plugins.environments) and the
checkpoint-IO plugins (lightning.pytorch.plugins.io: CheckpointIO, TorchCheckpointIO, AsyncCheckpointIO)."""

from __future__ import annotations

from trainer.plugins.environments import SLURMEnvironment
from trainer.plugins.io import AsyncCheckpointIO, CheckpointIO, TorchCheckpointIO

__all__ = ["AsyncCheckpointIO", "CheckpointIO", "SLURMEnvironment", "TorchCheckpointIO"]
