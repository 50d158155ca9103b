"""Tandem: a small, fast, Lightning-style trainer for PyTorch."""

from trainer.datamodule import DataModule
from trainer.errors import TandemError
from trainer.seed import seed_everything
from trainer.task import Task
from trainer.trainer import Trainer

__all__ = ["DataModule", "TandemError", "Task", "Trainer", "seed_everything"]
__version__ = "0.1.0"
