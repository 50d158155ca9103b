"""DeviceStatsMonitor: log the device's memory and utilisation statistics to the loggers during training."""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Any

from callbacks.base import Callback
from strategies.accelerators import cpu_stats, device_stats
from tandem_core.errors import ConfigError, MissingExtraError

if TYPE_CHECKING:
    from trainer.task.base import Task
    from trainer.trainer import Trainer


class DeviceStatsMonitor(Callback):
    """Logs ``DeviceStatsMonitor.<hook>/<statistic>`` at the start and end of training, validation and test
    batches, on the steps the Trainer logs (every `log_every_n_steps`); rank 0's device. `cpu_stats`: None logs
    the CPU's figures when training on the CPU, True adds them on a GPU too, False never logs them.
    Needs a logger, and for CPU figures the `psutil` package (``pip install 'tandem-trainer[stats]'``).
    """

    def __init__(self, cpu_stats: bool | None = None) -> None:
        self._cpu_stats = cpu_stats

    def setup(self, trainer: Trainer, task: Task, stage: str) -> None:
        if stage != "fit":
            return
        if not trainer.loggers:
            raise ConfigError(
                "DeviceStatsMonitor logs to the loggers: it cannot run with Trainer(logger=False)."
            )
        cpu = trainer.strategy.root_device.type == "cpu"
        if (self._cpu_stats or (self._cpu_stats is None and cpu)) and importlib.util.find_spec(
            "psutil"
        ) is None:
            raise MissingExtraError(
                "DeviceStatsMonitor needs the 'psutil' package for CPU statistics: pip install "
                "'tandem-trainer[stats]' (or pip install psutil), or pass cpu_stats=False."
            )

    def _log(self, trainer: Trainer, key: str) -> None:
        n = trainer.config.log_every_n_steps
        if (
            not n
            or not ((trainer.global_step + 1) % n == 0 or trainer.should_stop)
            or not trainer.is_global_zero
        ):
            return
        device = trainer.strategy.root_device
        if self._cpu_stats is False and device.type == "cpu":
            return
        stats = device_stats(device)
        if self._cpu_stats and device.type != "cpu":
            stats.update(cpu_stats())
        for logger in trainer.loggers:
            sep = getattr(logger, "group_separator", "/")
            prefix = f"{type(self).__qualname__}.{key}"
            logger.log_metrics(
                metrics={f"{prefix}{sep}{k}": float(v) for k, v in stats.items()}, step=trainer.global_step
            )

    def on_train_batch_start(self, trainer: Trainer, task: Task, batch: Any, batch_idx: int) -> None:
        self._log(trainer, "on_train_batch_start")

    def on_train_batch_end(
        self, trainer: Trainer, task: Task, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._log(trainer, "on_train_batch_end")

    def on_validation_batch_start(self, trainer: Trainer, task: Task, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:  # fmt: skip
        self._log(trainer, "on_validation_batch_start")

    def on_validation_batch_end(self, trainer: Trainer, task: Task, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:  # fmt: skip
        self._log(trainer, "on_validation_batch_end")

    def on_test_batch_start(self, trainer: Trainer, task: Task, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:  # fmt: skip
        self._log(trainer, "on_test_batch_start")

    def on_test_batch_end(self, trainer: Trainer, task: Task, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:  # fmt: skip
        self._log(trainer, "on_test_batch_end")
