"""Writing a resolved run config: as YAML that reads back to the same values, and into each run's log
directory by the callback that the config layer adds to the Trainers it builds. Example::

    save(resolve("digits.yaml"), "runs/digits.yaml")
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from omegaconf import OmegaConf

from callbacks.base import Callback
from trainer.fileio import atomic_write

if TYPE_CHECKING:
    from trainer.task.base import Task
    from trainer.trainer import Trainer


def to_yaml(config: Mapping[str, Any]) -> str:
    """The config as YAML that `load` reads back to the same values (``${`` in strings is escaped)."""
    return OmegaConf.to_yaml(OmegaConf.create(_escape(dict(config))))


def _escape(value: Any) -> Any:
    if isinstance(value, str):
        return value.replace("${", "\\${")
    if isinstance(value, dict):
        return {k: _escape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_escape(v) for v in value]
    return value


def save(config: Mapping[str, Any], path: str | os.PathLike[str]) -> str:
    """Write `config` as YAML to `path` (atomically); return the path."""
    path = os.fspath(path)
    atomic_write(path, to_yaml(config))
    return path


class SaveRunConfig(Callback):
    """Writes the resolved config that built the Trainer to ``<log_dir>/config.yaml`` at the start of
    every fit/validate/test/predict, on global rank 0 (not under fast_dev_run, which writes no files)."""

    def __init__(self, config: Mapping[str, Any], filename: str = "config.yaml") -> None:
        self.config, self.filename = config, filename

    def setup(self, trainer: Trainer, task: Task, stage: str) -> None:
        if trainer.is_global_zero and not trainer.config.fast_dev_run:
            save(self.config, os.path.join(trainer.log_dir, self.filename))
