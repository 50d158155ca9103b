"""CSV metrics: one metrics.csv row per step with every key seen, and hparams.yaml."""

from __future__ import annotations

import csv
import os
from typing import Any

from trainer.loggers.base import Logger, flatten


class CSVLogger(Logger):
    """Writes save_dir/name/version_N/metrics.csv. Example: ``CSVLogger("runs")``."""

    def __init__(self, save_dir: str = ".", name: str = "logs", version: int | str | None = None) -> None:
        super().__init__(save_dir, name, version)
        self.rows: list[dict[str, Any]] = []

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.rows.append({"step": step, **metrics})

    def log_hyperparams(self, params: dict[str, Any], metrics: dict[str, float] | None = None) -> None:
        import yaml  # PyYAML comes with omegaconf

        os.makedirs(self.log_dir, exist_ok=True)
        with open(os.path.join(self.log_dir, "hparams.yaml"), "w") as f:
            yaml.safe_dump(flatten(params), f, sort_keys=False)

    def save(self) -> None:
        """Rewrite metrics.csv with the union of all keys as columns (keys can appear late)."""
        if not self.rows:
            return
        os.makedirs(self.log_dir, exist_ok=True)
        keys: list[str] = []
        for row in self.rows:
            keys.extend(k for k in row if k not in keys)
        path = os.path.join(self.log_dir, "metrics.csv")
        with open(path + ".tmp", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=keys)
            writer.writeheader()
            writer.writerows(self.rows)
        os.replace(path + ".tmp", path)
