"""The type each top-level slot of a config builds (task, data, callbacks, logger, strategy)."""

from __future__ import annotations

from callbacks.base import Callback
from strategies.base import Strategy
from trainer.loggers import Logger
from trainer.task.base import Task
from trainer.task.datamodule import DataModule


def slot_types() -> dict[str, type]:
    """The type each top-level slot builds."""
    return {"task": Task, "data": DataModule, "callbacks": Callback, "logger": Logger, "strategy": Strategy}
