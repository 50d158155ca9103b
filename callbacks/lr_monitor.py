"""LearningRateMonitor: write each optimizer's learning rate (and optionally momentum) to the loggers."""

from __future__ import annotations

import warnings
from collections import Counter
from typing import TYPE_CHECKING, Any

import torch

from callbacks.base import Callback
from tandem_core.errors import ConfigError, check_choice

if TYPE_CHECKING:
    from trainer.task.base import Task
    from trainer.trainer import Trainer


def _group_names(name: str, groups: list[dict[str, Any]]) -> list[str]:
    """One key per parameter group: ``name/<group's "name">`` (``name/pg<i>`` for an unnamed one of several)."""
    labels = [g.get("name", f"pg{i}") for i, g in enumerate(groups, start=1)]
    twice = sorted({n for n in labels if labels.count(n) > 1})
    if twice:
        raise ConfigError(
            f"{name}: parameter groups of one optimizer share the name(s) {twice}; name each uniquely."
        )
    if len(groups) == 1:
        return [f"{name}/{groups[0]['name']}" if groups[0].get("name") else name]
    return [f"{name}/{label}" for label in labels]


class LearningRateMonitor(Callback):
    """Logs ``lr-<Optimizer>`` (``lr-<Optimizer>/pg<i>``, or the group's ``"name"``, per parameter group).

    `logging_interval` "step" writes every `log_every_n_steps` optimizer-stepping batches, "epoch" at every epoch
    start, None follows each scheduler's own interval (optimizers without a scheduler: both). A scheduler
    config's ``"name"`` replaces ``lr-<Optimizer>``; a second optimizer of the same class gets ``-1``. With
    `log_momentum` (`log_weight_decay`) also ``<key>-momentum`` (``-weight_decay``). The values written are in
    ``lrs``, ``last_momentum_values`` and ``last_weight_decay_values``, and in ``trainer.callback_metrics``
    (so that EarlyStopping may monitor them). Example: ``LearningRateMonitor(logging_interval="step")``.
    """

    def __init__(
        self, logging_interval: str | None = None, log_momentum: bool = False, log_weight_decay: bool = False
    ) -> None:
        if logging_interval is not None:
            check_choice("LearningRateMonitor logging_interval", logging_interval, ("step", "epoch"))
        self.logging_interval = logging_interval
        self.log_momentum = log_momentum
        self.log_weight_decay = log_weight_decay
        self.lrs: dict[str, list[float]] = {}  # every learning rate written, by key
        self.last_momentum_values: dict[str, float | None] = {}
        self.last_weight_decay_values: dict[str, float | None] = {}
        self._stepped = 0  # training batches that ran an optimizer step (Lightning counts logging steps so)
        self._seen_step = 0
        self._last_logged = -1

    def _named(self, trainer: Trainer) -> list[tuple[torch.optim.Optimizer, list[str], str | None]]:
        """(optimizer, a key per parameter group, its scheduler's interval or None): schedulers first, then
        the optimizers without one."""
        out: list[tuple[Any, list[str], str | None]] = []
        classes: Counter[type] = Counter()
        seen: list[Any] = []

        def add(opt: Any, name: str | None, interval: str | None) -> None:
            seen.append(opt)
            if name is None:  # only unnamed ones are numbered: lr-SGD, lr-SGD-1, ...
                classes[type(opt)] += 1
                count = classes[type(opt)]
                name = f"lr-{type(opt).__name__}" + (f"-{count - 1}" if count > 1 else "")
            out.append((opt, _group_names(name, opt.param_groups), interval))

        for cfg in trainer.lr_scheduler_configs:
            add(cfg.scheduler.optimizer, cfg.name, cfg.interval)
        for opt in trainer.optimizers:
            opt = getattr(opt, "optimizer", opt)  # a wrapped optimizer: the torch one underneath
            if not any(opt is s for s in seen):
                add(opt, None, None)
        return out

    def on_train_start(self, trainer: Trainer, task: Task) -> None:
        """Check the loggers and the optimizers, and name every parameter group."""
        if not trainer.loggers:
            raise ConfigError(
                "LearningRateMonitor writes to loggers, but the Trainer has none; "
                "pass logger=True (or a Logger) or remove the callback."
            )
        named = self._named(trainer)
        if self.log_momentum and any(
            "momentum" not in opt.defaults and "betas" not in opt.defaults for opt, _, _ in named
        ):
            warnings.warn(
                "LearningRateMonitor(log_momentum=True): an optimizer has neither momentum nor betas; "
                "its momentum is logged as 0.",
                RuntimeWarning,
                stacklevel=2,
            )
        keys = [k for _, names, _ in named for k in names]
        self.lrs = {k: [] for k in keys}
        self.last_momentum_values = {f"{k}-momentum": None for k in keys}
        self.last_weight_decay_values = {f"{k}-weight_decay": None for k in keys}
        self._stepped = self._seen_step = trainer.global_step
        self._last_logged = -1

    def _stats(self, trainer: Trainer, interval: str) -> dict[str, float]:
        """The values of the optimizers due at `interval` ("step" or "epoch"; "any" for all)."""
        stats: dict[str, float] = {}
        for opt, names, sched_interval in self._named(trainer):
            for key in names:  # a group added since (finetuning): the first group's history moves to /pg1
                alone = key.replace("/pg1", "")
                if "/pg1" in key and alone in self.lrs:
                    self.lrs[key] = self.lrs.pop(alone)
                self.lrs.setdefault(key, [])
            if sched_interval is not None and interval not in ("any", sched_interval):
                continue
            betas = "betas" in opt.defaults
            for group, key in zip(opt.param_groups, names):
                stats[key] = group["lr"]
                self.lrs[key].append(group["lr"])
                if self.log_momentum:
                    momentum = group["betas"][0] if betas else group.get("momentum", 0)
                    stats[f"{key}-momentum"] = self.last_momentum_values[f"{key}-momentum"] = momentum
                if self.log_weight_decay:
                    decay = group["weight_decay"]
                    stats[f"{key}-weight_decay"] = self.last_weight_decay_values[f"{key}-weight_decay"] = (
                        decay
                    )
        return stats

    def _write(self, trainer: Trainer, stats: dict[str, float]) -> None:
        if not stats:
            return
        device = trainer.strategy.root_device
        trainer.callback_metrics.update({k: torch.tensor(v, device=device) for k, v in stats.items()})
        trainer.logged_metrics.update(stats)
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics(metrics=stats, step=trainer.global_step)

    def on_train_batch_start(self, trainer: Trainer, task: Task, batch: Any, batch_idx: int) -> None:
        """Write the learning rates the coming steps use, every log_every_n_steps stepping batches."""
        if trainer.global_step != self._seen_step:  # the previous batch stepped (manual: maybe several times)
            self._seen_step = trainer.global_step
            self._stepped += 1
        if self.logging_interval == "epoch" or self._stepped == self._last_logged:
            return
        n = trainer.config.log_every_n_steps  # 0: no step logging (Lightning)
        if n and ((self._stepped + 1) % n == 0 or trainer.should_stop):
            self._last_logged = self._stepped
            self._write(trainer, self._stats(trainer, "step" if self.logging_interval is None else "any"))

    def on_train_epoch_start(self, trainer: Trainer, task: Task) -> None:
        if self.logging_interval != "step":
            self._write(trainer, self._stats(trainer, "epoch" if self.logging_interval is None else "any"))
