"""The Logger interface and run-directory versioning shared by every logger."""

from __future__ import annotations

import os
import re
from typing import Any


def next_version(root: str) -> int:
    """The first unused N among root/version_N (0 when root does not exist)."""
    if not os.path.isdir(root):
        return 0
    used = [int(m.group(1)) for d in os.listdir(root) if (m := re.fullmatch(r"version_(\d+)", d))]
    return max(used, default=-1) + 1


class Logger:
    """Receives metrics as floats at a step. Only rank 0's Trainer calls a logger.

    Example: ``Trainer(logger=[TensorBoardLogger("runs"), CSVLogger("runs")])``.
    """

    def __init__(self, save_dir: str = ".", name: str = "logs", version: int | str | None = None) -> None:
        self.save_dir = save_dir
        self.name = name
        self._version = version

    @property
    def version(self) -> int | str:
        if self._version is None:
            self._version = next_version(os.path.join(self.save_dir, self.name))
        return self._version

    @property
    def log_dir(self) -> str:
        version = self.version if isinstance(self.version, str) else f"version_{self.version}"
        return os.path.join(self.save_dir, self.name, version)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """Write scalar metrics at a step."""
        raise NotImplementedError

    def log_hyperparams(self, params: dict[str, Any], metrics: dict[str, float] | None = None) -> None:
        """Record the run's hyperparameters (with final metrics when given)."""

    def save(self) -> None:
        """Flush what was written."""

    def finalize(self, status: str) -> None:
        """Called once at the end of a run with 'success' or 'failed'."""
        self.save()


def flatten(params: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'a': {'b': 1}} -> {'a/b': 1}; values that are not scalars become strings."""
    out: dict[str, Any] = {}
    for k, v in params.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "/"))
        elif isinstance(v, (int, float, str, bool)) or v is None:
            out[key] = v if v is not None else "None"
        else:
            out[key] = str(v)
    return out
