"""Loggers: TensorBoard (the default) and CSV."""

from trainer.loggers.base import Logger, agree_versions, align_versions, claim_version
from trainer.loggers.csv_logs import CSVLogger
from trainer.loggers.tensorboard import TensorBoardLogger

__all__ = ["CSVLogger", "Logger", "TensorBoardLogger", "agree_versions", "align_versions", "claim_version"]
