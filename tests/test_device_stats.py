"""DeviceStatsMonitor: the device's statistics (psutil's on the CPU) logged at batch starts and ends on the
logging steps, under Lightning's key names; refused without a logger."""

from __future__ import annotations

import pytest
from callback_tasks import Scored, loader
from conftest import FAST

from callbacks import DeviceStatsMonitor
from tandem_core.errors import ConfigError
from trainer import Trainer
from trainer.loggers import Logger

pytest.importorskip("psutil", reason="the stats extra: pip install 'tandem-trainer[stats]'")


class Recording(Logger):
    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.logged: list[tuple[int, dict]] = []

    def log_metrics(self, metrics, step):
        self.logged.append((step, dict(metrics)))


def test_cpu_statistics_are_logged_on_logging_steps(tmp_path):
    logger = Recording(str(tmp_path))
    trainer = Trainer(
        max_epochs=2, callbacks=[DeviceStatsMonitor()], **{**FAST, "logger": logger, "log_every_n_steps": 2}
    )
    trainer.fit(Scored(), loader(6, 2), loader(2, 2))  # 3 steps per epoch
    keys = {k for _, m in logger.logged for k in m if k.startswith("DeviceStatsMonitor")}
    for hook in ("on_train_batch_start", "on_train_batch_end", "on_validation_batch_start"):
        assert (
            f"DeviceStatsMonitor.{hook}/cpu_percent" in keys
            and f"DeviceStatsMonitor.{hook}/cpu_vm_percent" in keys
        )
    steps = sorted(
        {s for s, m in logger.logged if "DeviceStatsMonitor.on_train_batch_start/cpu_percent" in m}
    )
    assert steps == [1, 3, 5]  # Lightning's moment: (step + 1) % log_every_n_steps == 0


def test_needs_a_logger_and_cpu_stats_false_logs_nothing(tmp_path):
    with pytest.raises(ConfigError, match="logger=False"):
        Trainer(max_epochs=1, callbacks=[DeviceStatsMonitor()], **FAST).fit(Scored(), loader())
    logger = Recording(str(tmp_path))
    Trainer(max_epochs=1, callbacks=[DeviceStatsMonitor(cpu_stats=False)], **{**FAST, "logger": logger}).fit(
        Scored(), loader()
    )
    assert not any(k.startswith("DeviceStatsMonitor") for _, m in logger.logged for k in m)
