"""Loggers: TensorBoard (the default), CSV, and the trackers Weights & Biases and MLflow (optional extras)."""

from typing import Any

from tandem_core.errors import ConfigError
from trainer.loggers.base import Logger, agree_versions, align_versions, claim_version
from trainer.loggers.csv_logs import CSVLogger
from trainer.loggers.dummy import DummyLogger
from trainer.loggers.mlflow_logger import MLFlowLogger
from trainer.loggers.tensorboard import TensorBoardLogger
from trainer.loggers.wandb_logger import WandbLogger

__all__ = [
    "CSVLogger",
    "DummyLogger",
    "Logger",
    "MLFlowLogger",
    "TensorBoardLogger",
    "WandbLogger",
    "agree_versions",
    "align_versions",
    "claim_version",
]

# Lightning's other loggers: refused by name, saying what works instead
_REFUSED = {"CometLogger": "Comet", "NeptuneLogger": "Neptune", "LitLogger": "Lightning AI's LitLogger"}


def __getattr__(name: str) -> Any:
    if name in _REFUSED:
        raise ConfigError(
            f"{name} is not available in Tandem: {_REFUSED[name]} is not supported (it cannot be tested here "
            "without the service). Use WandbLogger, MLFlowLogger, TensorBoardLogger or CSVLogger from "
            "trainer.loggers, or subclass trainer.loggers.Logger (log_metrics, log_hyperparams, finalize)."
        )
    raise AttributeError(f"module 'trainer.loggers' has no attribute {name!r}")
