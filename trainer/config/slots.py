"""The type each top-level slot of a config builds (task, data, callbacks, logger, strategy, trainer.plugins)."""

from __future__ import annotations

from callbacks.base import Callback
from strategies.base import Strategy
from strategies.plugins import plugin_type
from trainer.loggers import Logger
from trainer.task.base import Task
from trainer.task.datamodule import DataModule


def slot_types() -> dict[str, type]:
    """The type each top-level slot builds."""
    return {
        "task": Task,
        "data": DataModule,
        "callbacks": Callback,
        "logger": Logger,
        "strategy": Strategy,
        "plugins": plugin_type(),  # a precision plugin, cluster environment, checkpoint IO or layer sync
    }
