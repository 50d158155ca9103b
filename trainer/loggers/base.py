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


def align_versions(loggers: list[Logger]) -> list[Logger]:
    """Give loggers that share save_dir/name (and have no fixed version) the same next free version_N.

    Each logger picks its version when first used, so without this ``[TensorBoardLogger("runs"),
    CSVLogger("runs")]`` would write into version_0 and version_1.
    """
    groups: dict[str, list[Logger]] = {}
    for lg in loggers:
        if lg._version is None:
            groups.setdefault(os.path.abspath(lg.root_dir), []).append(lg)
    for root, group in groups.items():
        if len(group) > 1:
            version = next_version(root)
            for lg in group:
                lg._version = version
    return loggers


class Logger:
    """Receives metrics as floats at a step. Only rank 0's Trainer calls a logger.

    Example: ``Trainer(logger=[TensorBoardLogger("runs"), CSVLogger("runs")])`` writes both
    ``runs/logs/version_0/events.out.tfevents.*`` and ``runs/logs/version_0/metrics.csv``.
    """

    def __init__(
        self, save_dir: str = ".", name: str | None = "logs", version: int | str | None = None
    ) -> None:
        self.save_dir = os.fspath(save_dir)
        self.name = name or ""
        self._version = version

    @property
    def root_dir(self) -> str:
        """save_dir/name: the directory that holds every version of this experiment."""
        return os.path.join(self.save_dir, self.name)

    @property
    def version(self) -> int | str:
        """The run's version: fixed at the first access to the next free version_N unless given."""
        if self._version is None:
            self._version = next_version(self.root_dir)
        return self._version

    @property
    def log_dir(self) -> str:
        version = self.version if isinstance(self.version, str) else f"version_{self.version}"
        return os.path.join(self.root_dir, version)

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


def yaml_safe(value: Any) -> Any:
    """`value` with only YAML-safe types (dicts, lists, numbers, strings); anything else becomes its str()."""
    if isinstance(value, dict):
        return {str(k): yaml_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [yaml_safe(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)
