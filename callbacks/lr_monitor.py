"""LearningRateMonitor: write each optimizer's learning rate (and optionally momentum) to the loggers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from callbacks.base import Callback
from tandem_core.errors import ConfigError, check_choice

if TYPE_CHECKING:
    from trainer.task.base import Task
    from trainer.trainer import Trainer


class LearningRateMonitor(Callback):
    """Logs ``lr-<Optimizer>`` (``lr-<Optimizer>/pg<i>`` per parameter group when there are several).

    `logging_interval` "step" writes every `log_every_n_steps` steps, "epoch" at every epoch start, None
    follows each scheduler's own interval (epoch for optimizers without one). A scheduler config's
    ``"name"`` replaces ``lr-<Optimizer>``. Example: ``LearningRateMonitor(logging_interval="step")``.
    """

    def __init__(
        self, logging_interval: str | None = None, log_momentum: bool = False, log_weight_decay: bool = False
    ) -> None:
        if logging_interval is not None:
            check_choice("LearningRateMonitor logging_interval", logging_interval, ("step", "epoch"))
        self.logging_interval = logging_interval
        self.log_momentum = log_momentum
        self.log_weight_decay = log_weight_decay
        self.lrs: dict[str, list[float]] = {}  # every value written, by name
        self._names: list[tuple[torch.optim.Optimizer, str, str]] = []  # (optimizer, name, interval)
        self._last_step = -1

    def on_train_start(self, trainer: Trainer, task: Task) -> None:
        """Name every optimizer once (the names must not change during the run)."""
        if not trainer.loggers:
            raise ConfigError(
                "LearningRateMonitor writes to loggers, but the Trainer has none; "
                "pass logger=True (or a Logger) or remove the callback."
            )
        intervals = {id(c.scheduler.optimizer): c for c in trainer.lr_scheduler_configs}
        counts: dict[str, int] = {}
        self._names = []
        for opt in trainer.optimizers:
            cfg = intervals.get(id(opt))
            base = cfg.name if cfg is not None and cfg.name else f"lr-{type(opt).__name__}"
            seen = counts.get(base, 0)
            counts[base] = seen + 1
            name = base if seen == 0 else f"{base}-{seen}"
            self._names.append((opt, name, cfg.interval if cfg is not None else "epoch"))
        self.lrs = {}

    def _wanted(self, interval: str, sched_interval: str) -> bool:
        return (self.logging_interval or sched_interval) == interval

    def _stats(self, interval: str) -> dict[str, float]:
        stats: dict[str, float] = {}
        for opt, name, sched_interval in self._names:
            if not self._wanted(interval, sched_interval):
                continue
            groups = opt.param_groups
            for i, group in enumerate(groups):
                key = name if len(groups) == 1 else f"{name}/pg{i + 1}"
                stats[key] = float(group["lr"])
                if self.log_momentum:
                    momentum = group.get("betas", (group.get("momentum", 0.0),))[0]
                    stats[f"{key}-momentum"] = float(momentum)
                if self.log_weight_decay:
                    stats[f"{key}-weight_decay"] = float(group.get("weight_decay", 0.0))
        return stats

    def _write(self, trainer: Trainer, stats: dict[str, float]) -> None:
        if not stats:
            return
        for k, v in stats.items():
            self.lrs.setdefault(k, []).append(v)
        trainer.logged_metrics.update(stats)
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics(stats, trainer.global_step)

    def on_train_batch_start(self, trainer: Trainer, task: Task, batch: Any, batch_idx: int) -> None:
        """Write the learning rate the coming optimizer step uses, every log_every_n_steps steps."""
        step = trainer.global_step
        if self.logging_interval == "epoch" or step == self._last_step:
            return
        n = trainer.config.log_every_n_steps  # 0: no step logging (Lightning)
        if n and (step + 1) % n == 0:
            self._last_step = step
            self._write(trainer, self._stats("step"))

    def on_train_epoch_start(self, trainer: Trainer, task: Task) -> None:
        if self.logging_interval != "step":
            self._write(trainer, self._stats("epoch"))
