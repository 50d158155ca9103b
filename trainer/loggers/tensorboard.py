"""TensorBoard event files: scalars at the global step, hyperparameters in the HParams tab."""

from __future__ import annotations

import os
from typing import Any

from trainer.loggers.base import Logger, flatten


class TensorBoardLogger(Logger):
    """Writes to save_dir/name/version_N. Example: ``TensorBoardLogger("runs", name="digits")``."""

    def __init__(self, save_dir: str = ".", name: str = "logs", version: int | str | None = None) -> None:
        super().__init__(save_dir, name, version)
        self._writer: Any = None
        self._hparams: dict[str, Any] = {}

    @property
    def experiment(self) -> Any:
        """The SummaryWriter, created on first use (importing tensorboard is slow)."""
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            os.makedirs(self.log_dir, exist_ok=True)
            self._writer = SummaryWriter(log_dir=self.log_dir)
        return self._writer

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        for name, value in metrics.items():
            self.experiment.add_scalar(name, value, global_step=step)

    def log_hyperparams(self, params: dict[str, Any], metrics: dict[str, float] | None = None) -> None:
        self._hparams.update(flatten(params))
        if metrics is None:
            return
        from torch.utils.tensorboard.summary import hparams

        # Written into this run's own event file (SummaryWriter.add_hparams would start a sub-run).
        exp, ssi, sei = hparams(self._hparams, metrics)
        writer = self.experiment._get_file_writer()
        for summary in (exp, ssi, sei):
            writer.add_summary(summary)

    def save(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def finalize(self, status: str) -> None:
        if self._writer is not None:
            self._writer.flush()
            self._writer.close()
            self._writer = None
