"""Loggers: TensorBoard (the default), CSV, and the trackers Weights & Biases and MLflow (optional extras)."""

from trainer.loggers.base import Logger, agree_versions, align_versions, claim_version
from trainer.loggers.csv_logs import CSVLogger
from trainer.loggers.dummy import DummyExperiment, DummyLogger, rank_zero_experiment
from trainer.loggers.mlflow_logger import MLFlowLogger
from trainer.loggers.refused import CometLogger, LitLogger, NeptuneLogger  # importable; refused when built
from trainer.loggers.tensorboard import TensorBoardLogger
from trainer.loggers.wandb_logger import WandbLogger

__all__ = [
    "CSVLogger",
    "CometLogger",
    "LitLogger",
    "NeptuneLogger",
    "DummyExperiment",
    "DummyLogger",
    "Logger",
    "MLFlowLogger",
    "TensorBoardLogger",
    "WandbLogger",
    "agree_versions",
    "align_versions",
    "claim_version",
    "rank_zero_experiment",
]
