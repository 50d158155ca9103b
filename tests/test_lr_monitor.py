"""LearningRateMonitor: the rate (and momentum) of every parameter group, per epoch or per step."""

from __future__ import annotations

import csv

import pytest
import torch
from callback_tasks import Scored, fit

from callbacks import LearningRateMonitor
from tandem_core.errors import ConfigError
from trainer.loggers import CSVLogger


class Scheduled(Scored):
    def __init__(self, interval: str = "epoch", groups: int = 1) -> None:
        super().__init__()
        self.interval, self.groups = interval, groups
        self.other = torch.nn.Linear(2, 1)

    def configure_optimizers(self):
        params = [{"params": self.net.parameters()}]
        if self.groups == 2:
            params.append({"params": self.other.parameters(), "lr": 1.0})
        opt = torch.optim.SGD(params, lr=0.1, momentum=0.9)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": self.interval}}


def csv_columns(logger: CSVLogger) -> dict[str, list[tuple[int, float]]]:
    out: dict[str, list[tuple[int, float]]] = {}
    with open(logger.metrics_file) as f:
        for row in csv.DictReader(f):
            for k, v in row.items():
                if k != "step" and v:
                    out.setdefault(k, []).append((int(row["step"]), float(v)))
    return out


def test_lr_monitor_per_epoch_and_per_step(tmp_path):
    logger = CSVLogger(str(tmp_path), name="epoch")
    monitor = LearningRateMonitor(log_momentum=True)
    fit(Scheduled("epoch"), [monitor], epochs=3, val=False, logger=logger, enable_checkpointing=False)
    cols = csv_columns(logger)
    assert cols["lr-SGD"] == [(0, 0.1), (2, 0.05), (4, 0.025)]
    assert cols["lr-SGD-momentum"] == [(0, 0.9), (2, 0.9), (4, 0.9)]

    logger = CSVLogger(str(tmp_path), name="step")
    monitor = LearningRateMonitor(logging_interval="step")
    fit(
        Scheduled("step", groups=2),
        [monitor],
        epochs=2,
        val=False,
        logger=logger,
        log_every_n_steps=2,
        enable_checkpointing=False,
    )
    cols = csv_columns(logger)  # written before steps 2 and 4, with the rate those steps use
    assert cols["lr-SGD/pg1"] == [(1, 0.05), (3, 0.0125)]
    assert cols["lr-SGD/pg2"] == [(1, 0.5), (3, 0.125)]


def test_lr_monitor_needs_a_logger():
    with pytest.raises(ConfigError, match="no"):
        fit(Scheduled(), [LearningRateMonitor()], epochs=1, val=False, enable_checkpointing=False)
