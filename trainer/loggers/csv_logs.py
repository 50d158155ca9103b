"""CSV metrics: metrics.csv with one row per step and a column per key seen, and hparams.yaml."""

from __future__ import annotations

import csv
import io
import os
from typing import Any

from trainer.fileio import atomic_write
from trainer.loggers.base import Logger, yaml_safe


class CSVLogger(Logger):
    """Writes save_dir/name/version_N/metrics.csv (and hparams.yaml).

    Rows are appended every `flush_logs_every_n_steps` steps and at the end; the file is rewritten only
    when a new column appears. Example: ``Trainer(logger=CSVLogger("runs"))``.
    """

    def __init__(
        self,
        save_dir: str = ".",
        name: str | None = "logs",
        version: int | str | None = None,
        flush_logs_every_n_steps: int = 100,
    ) -> None:
        super().__init__(save_dir, name, version)
        self.flush_logs_every_n_steps = flush_logs_every_n_steps
        self.rows: list[dict[str, Any]] = []
        self._columns: list[str] = []
        self._written = 0  # rows already in the file
        self._rewrite = False  # a written row changed: rewrite the whole file
        self._last_flush_step = 0

    @property
    def metrics_file(self) -> str:
        return os.path.join(self.log_dir, "metrics.csv")

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        last = self.rows[-1] if self.rows else None
        # values written at the same step (train epoch means, then validation) share one row
        if last is not None and last["step"] == step and all(last.get(k, v) == v for k, v in metrics.items()):
            last.update(metrics)
            self._rewrite = self._rewrite or len(self.rows) <= self._written
        else:
            self.rows.append({"step": step, **metrics})
        if step - self._last_flush_step >= self.flush_logs_every_n_steps:
            self._last_flush_step = step
            self.save()

    def log_hyperparams(self, params: dict[str, Any], metrics: dict[str, float] | None = None) -> None:
        import yaml  # PyYAML comes with omegaconf

        atomic_write(
            os.path.join(self.log_dir, "hparams.yaml"), yaml.safe_dump(yaml_safe(params), sort_keys=False)
        )

    def save(self) -> None:
        """Append the new rows; rewrite the file when a column was added or a written row changed."""
        if len(self.rows) == self._written and not self._rewrite:
            return
        os.makedirs(self.log_dir, exist_ok=True)
        new = self.rows[self._written :]
        added = [k for row in (self.rows if self._rewrite else new) for k in row if k not in self._columns]
        path = self.metrics_file
        if added or self._rewrite or not os.path.exists(path):
            self._columns.extend(dict.fromkeys(added))
            text = io.StringIO(newline="")
            writer = csv.DictWriter(text, fieldnames=self._columns)
            writer.writeheader()
            writer.writerows(self.rows)
            atomic_write(path, text.getvalue())  # the header or a written row changed: replace it all
        else:  # cheap, and a crash can tear at most the rows of this append, never earlier ones
            with open(path, "a", newline="", encoding="utf-8") as f:
                csv.DictWriter(f, fieldnames=self._columns).writerows(new)
        self._written, self._rewrite = len(self.rows), False
