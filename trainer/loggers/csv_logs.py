"""CSV metrics: metrics.csv with one row per log_metrics call and a column per key seen (Lightning's layout),
and hparams.yaml. A run resumed into its own version directory appends: the rows already there stay."""

from __future__ import annotations

import csv
import io
import os
from typing import Any

from tandem_core.fileio import atomic_write
from tandem_core.rank_zero import rank_zero_only
from trainer.loggers.base import Logger, add_prefix, as_params, write_hparams_yaml
from trainer.loggers.dummy import rank_zero_experiment


class ExperimentWriter:
    """What ``CSVLogger.experiment`` gives: the rows not yet written (``metrics``), ``log_metrics``, ``log_hparams``
    and ``save``, as Lightning's ExperimentWriter. Example: ``logger.experiment.log_metrics({"loss": 0.1})``."""

    NAME_HPARAMS_FILE = "hparams.yaml"
    NAME_METRICS_FILE = "metrics.csv"

    def __init__(self, logger: CSVLogger) -> None:
        self._logger = logger
        self.hparams: dict[str, Any] = {}

    @property
    def log_dir(self) -> str:
        """The version directory written into."""
        return self._logger.log_dir

    @property
    def metrics_file_path(self) -> str:
        """The path of metrics.csv."""
        return self._logger.metrics_file

    @property
    def metrics(self) -> list[dict[str, Any]]:
        """The rows logged since the last save (emptied by it)."""
        return self._logger.rows[self._logger._written :]

    def log_metrics(self, metrics_dict: dict[str, Any], step: int | None = None) -> None:
        """Add a row (step: the number of rows so far when not given); written at the next save."""
        self._logger._add_row(metrics_dict, step)

    def log_hparams(self, params: dict[str, Any]) -> None:
        """Write hparams.yaml with these hyperparameters added."""
        self.hparams.update(params)
        write_hparams_yaml(self.log_dir, self.hparams)

    def save(self) -> None:
        """Write the rows logged since the last save."""
        self._logger.save()


class CSVLogger(Logger):
    """Writes save_dir/name/version_N/metrics.csv (and hparams.yaml).

    Rows are appended at each step with ``(step + 1) % flush_logs_every_n_steps == 0`` (Lightning's rule) and
    at the end; the file is rewritten only
    when a new column appears. Rows found in the file when the logger first writes (a resumed run in
    the same version) are kept in front. `prefix` (Lightning's) names the columns ``f"{prefix}-{key}"``.
    Example: ``Trainer(logger=CSVLogger("runs"))``.
    """

    def __init__(
        self,
        save_dir: str = ".",
        name: str | None = "lightning_logs",
        version: int | str | None = None,
        prefix: str = "",
        flush_logs_every_n_steps: int = 100,
    ) -> None:
        super().__init__(save_dir, name, version)
        self.prefix = prefix
        self.flush_logs_every_n_steps = flush_logs_every_n_steps
        self.rows: list[dict[str, Any]] = []
        self._columns: list[str] = []
        self._written = 0  # rows already in the file
        self._opened = False  # whether the file's earlier rows (a resumed run) were read
        self._experiment: ExperimentWriter | None = None

    @property
    @rank_zero_experiment
    def experiment(self) -> ExperimentWriter:
        """The writer of metrics.csv and hparams.yaml (Lightning's ExperimentWriter); on ranks other than 0 a
        DummyExperiment (Lightning's)."""
        if self._experiment is None:
            self._experiment = ExperimentWriter(self)
        return self._experiment

    @property
    def metrics_file(self) -> str:
        """The path of the metrics CSV file."""
        return os.path.join(self.log_dir, "metrics.csv")

    def _add_row(self, metrics: dict[str, Any], step: int | None) -> int:
        if step is None:  # Lightning: the number of rows not yet written
            step = len(self.rows) - self._written
        values = {k: v.item() if hasattr(v, "item") else v for k, v in metrics.items()}  # tensors as numbers
        self.rows.append({**values, "step": step})  # one row per call, as Lightning's
        return step

    @rank_zero_only
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        step = self._add_row(add_prefix(metrics, self.prefix), step)
        if (step + 1) % self.flush_logs_every_n_steps == 0:  # Lightning's rule
            self.save()

    @rank_zero_only
    def log_hyperparams(
        self, params: dict[str, Any] | None = None, metrics: dict[str, float] | None = None
    ) -> None:
        """Write hparams.yaml (every call's hyperparameters together, as Lightning's)."""
        self.experiment.log_hparams(as_params(params))

    @rank_zero_only
    def save(self) -> None:
        """Append the new rows; rewrite the file when a column was added."""
        path = self.metrics_file
        if not self._opened:
            self._opened = True
            self._read_existing(path)
        if len(self.rows) == self._written:
            return
        os.makedirs(self.log_dir, exist_ok=True)
        new = self.rows[self._written :]
        added = [k for row in new for k in row if k not in self._columns]
        if added or not os.path.exists(path):
            self._columns = sorted({*self._columns, *added})  # Lightning sorts the columns
            text = io.StringIO(newline="")
            writer = csv.DictWriter(text, fieldnames=self._columns)
            writer.writeheader()
            writer.writerows(self.rows)
            atomic_write(path, text.getvalue())  # the header or a written row changed: replace it all
        else:  # cheap, and a crash can tear at most the rows of this append, never earlier ones
            # O_NOFOLLOW: rows never go through a symlink planted at metrics.csv (its rows were not read)
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)
            with open(fd, "a", newline="", encoding="utf-8") as f:
                csv.DictWriter(f, fieldnames=self._columns).writerows(new)
        self._written = len(self.rows)

    def _read_existing(self, path: str) -> None:
        """Keep the rows of an earlier run in this version directory (a resume): nothing is lost. A symlink
        there is not read (nor written through: the first save replaces it with this run's file)."""
        if os.path.islink(path) or not os.path.isfile(path):
            return
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            earlier = [{k: v for k, v in row.items() if v != ""} for row in reader]
            self._columns = list(reader.fieldnames or [])
        self.rows[:0] = earlier
        self._written = len(earlier)
