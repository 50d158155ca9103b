"""Callbacks: hooks with (trainer, task, ...) signatures, and every callback of Lightning 2.6 by its name."""

from callbacks.averaging.swa import StochasticWeightAveraging
from callbacks.averaging.weight_averaging import EMAWeightAveraging, WeightAveraging
from callbacks.base import Callback, Checkpoint
from callbacks.checkpoint import ModelCheckpoint
from callbacks.device_stats import DeviceStatsMonitor
from callbacks.early_stopping import EarlyStopping
from callbacks.finders.batch_size_finder import BatchSizeFinder
from callbacks.finders.lr_finder import LearningRateFinder
from callbacks.finetuning import BackboneFinetuning, BaseFinetuning
from callbacks.grad_accumulation import GradientAccumulationScheduler
from callbacks.lambda_fn import LambdaCallback
from callbacks.lr_monitor import LearningRateMonitor
from callbacks.model_summary import ModelSummary
from callbacks.on_exception import OnExceptionCheckpoint
from callbacks.prediction_writer import BasePredictionWriter
from callbacks.progress import ProgressBar, RichProgressBar, TQDMProgressBar
from callbacks.pruning import ModelPruning
from callbacks.spike import SpikeDetection
from callbacks.summary.rich_table import RichModelSummary
from callbacks.throughput.monitor import ThroughputMonitor
from callbacks.timer import Timer

__all__ = [
    "BackboneFinetuning",
    "BaseFinetuning",
    "BasePredictionWriter",
    "BatchSizeFinder",
    "Callback",
    "Checkpoint",
    "DeviceStatsMonitor",
    "EarlyStopping",
    "GradientAccumulationScheduler",
    "LambdaCallback",
    "LearningRateFinder",
    "LearningRateMonitor",
    "ModelCheckpoint",
    "ModelPruning",
    "ModelSummary",
    "OnExceptionCheckpoint",
    "ProgressBar",
    "RichModelSummary",
    "RichProgressBar",
    "StochasticWeightAveraging",
    "SpikeDetection",
    "ThroughputMonitor",
    "Timer",
    "TQDMProgressBar",
    "EMAWeightAveraging",
    "WeightAveraging",
]
