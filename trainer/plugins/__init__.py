"""Lightning's plugins that Tandem takes: the SLURM environment (lightning.pytorch.plugins.environments)."""

from __future__ import annotations

from trainer.plugins.environments import SLURMEnvironment

__all__ = ["SLURMEnvironment"]
