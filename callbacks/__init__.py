"""Callbacks: hooks with (trainer, task, ...) signatures, and the ones Tandem ships."""

from callbacks.base import Callback
from callbacks.checkpoint import ModelCheckpoint
from callbacks.early_stopping import EarlyStopping
from callbacks.lr_monitor import LearningRateMonitor
from callbacks.model_summary import ModelSummary
from callbacks.progress import ProgressBar
from callbacks.timer import Timer

TQDMProgressBar = ProgressBar  # Lightning's name for the tqdm bar

__all__ = [
    "Callback",
    "EarlyStopping",
    "LearningRateMonitor",
    "ModelCheckpoint",
    "ModelSummary",
    "ProgressBar",
    "TQDMProgressBar",
    "Timer",
]
