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
from tandem_core.fileio import atomic_write
from trainer.secrets import split

if TYPE_CHECKING:
    from trainer.task.base import Task
    from trainer.trainer import Trainer


def to_yaml(config: Mapping[str, Any], secrets: dict[str, str] | None = None) -> str:
    """The config as YAML that `load` reads back to the same values (``${`` in strings is escaped), with
    each value of `secrets` written as its ``${oc.env:NAME}`` (trainer/secrets.py)."""
    return OmegaConf.to_yaml(OmegaConf.create(_escape(dict(config), secrets or {})))


def _escape(value: Any, secrets: dict[str, str]) -> Any:
    if isinstance(value, str):
        return "".join(p if live else p.replace("${", "\\${") for p, live in split(value, secrets))
    if isinstance(value, dict):
        return {k: _escape(v, secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [_escape(v, secrets) for v in value]
    return value


def save(
    config: Mapping[str, Any], path: str | os.PathLike[str], secrets: dict[str, str] | None = None
) -> str:
    """Write `config` as YAML to `path` (atomically), secrets as their interpolation; return the path."""
    path = os.fspath(path)
    atomic_write(path, to_yaml(config, secrets))
    return path


class SaveRunConfig(Callback):
    """Writes the resolved config that built the Trainer to ``<log_dir>/config.yaml`` at the start of
    every fit/validate/test/predict, on global rank 0 (not under fast_dev_run, which writes no files)."""

    def __init__(
        self, config: Mapping[str, Any], filename: str = "config.yaml", secrets: dict[str, str] | None = None
    ) -> None:
        self.config, self.filename, self.secrets = config, filename, secrets or {}

    def setup(self, trainer: Trainer, task: Task, stage: str) -> None:
        if trainer.is_global_zero and not trainer.config.fast_dev_run:
            save(self.config, os.path.join(trainer.log_dir, self.filename), self.secrets)
