"""Loggers: TensorBoard (the default) and CSV."""

from trainer.loggers.base import Logger, align_versions
from trainer.loggers.csv_logs import CSVLogger
from trainer.loggers.tensorboard import TensorBoardLogger

__all__ = ["CSVLogger", "Logger", "TensorBoardLogger", "align_versions"]
