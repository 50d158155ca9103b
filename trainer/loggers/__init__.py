"""Loggers: TensorBoard (the default) and CSV."""

from trainer.loggers.base import Logger
from trainer.loggers.csv_logs import CSVLogger
from trainer.loggers.tensorboard import TensorBoardLogger

__all__ = ["CSVLogger", "Logger", "TensorBoardLogger"]
