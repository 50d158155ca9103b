"""The ``optimizer`` and ``lr_scheduler`` sections (LightningCLI's): the task's ``configure_optimizers``
built from the config, for tasks that do not write one. Example::

    optimizer: {class_path: torch.optim.Adam, init_args: {lr: 0.01}}
    lr_scheduler: {class_path: ReduceLROnPlateau, init_args: {monitor: val/loss, patience: 2}}

As in LightningCLI, the task then returns the optimizer alone, ``[optimizer], [scheduler]``, or for a
ReduceLROnPlateau ``{"optimizer": ..., "lr_scheduler": {"scheduler": ..., "monitor": ...}}``; a task that
defines ``configure_optimizers`` itself gets a warning that the sections replace it. Unlike LightningCLI,
which builds the optimizer once before training, Tandem builds it when the Trainer calls
``configure_optimizers`` (after the strategy has set the task up), from the same classes and arguments.
"""

from __future__ import annotations

import types
import warnings
from collections.abc import Callable
from typing import Any

import torch

from tandem_core.errors import ConfigError
from trainer.config.targets import PARTIAL, TARGET, instantiate

OPTIMIZER = Callable[..., torch.optim.Optimizer]
SCHEDULER = Callable[..., torch.optim.lr_scheduler.LRScheduler]


class ReduceLROnPlateau(torch.optim.lr_scheduler.ReduceLROnPlateau):
    """torch's ReduceLROnPlateau with the metric it watches (Lightning's ``lightning.pytorch.cli``
    class of the same name): ``lr_scheduler: {class_path: ReduceLROnPlateau, init_args: {monitor: val/loss}}``."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        monitor: str,
        mode: str = "min",
        factor: float = 0.1,
        patience: int = 10,
        threshold: float = 1e-4,
        threshold_mode: str = "rel",
        cooldown: int = 0,
        min_lr: list[float] | float = 0,
        eps: float = 1e-8,
    ) -> None:
        super().__init__(optimizer, mode, factor, patience, threshold, threshold_mode, cooldown, min_lr, eps)  # type: ignore[arg-type]
        self.monitor = monitor


class ConfiguredOptimizers:
    """The ``configure_optimizers`` of a task whose config has an ``optimizer`` section (bound to the task)."""

    def __init__(self, optimizer: dict[str, Any], lr_scheduler: dict[str, Any] | None) -> None:
        self.optimizer, self.lr_scheduler = optimizer, lr_scheduler

    def __call__(self, task: torch.nn.Module) -> Any:
        optimizer = _call(self.optimizer, "optimizer", OPTIMIZER, task.parameters())
        if self.lr_scheduler is None:
            return optimizer
        scheduler = _call(self.lr_scheduler, "lr_scheduler", SCHEDULER, optimizer)
        if isinstance(scheduler, ReduceLROnPlateau):
            return {
                "optimizer": optimizer,
                "lr_scheduler": {"scheduler": scheduler, "monitor": scheduler.monitor},
            }
        return [optimizer], [scheduler]


def attach(task: Any, optimizer: dict[str, Any] | None, lr_scheduler: dict[str, Any] | None) -> None:
    """Give `task` the configure_optimizers of the sections (nothing without an optimizer section)."""
    if optimizer is None:
        return
    from trainer.task.base import Task

    if type(task).configure_optimizers is not Task.configure_optimizers:
        warnings.warn(
            f"`{type(task).__name__}.configure_optimizers` will be overridden by the config's optimizer"
            + (" and lr_scheduler sections" if lr_scheduler is not None else " section"),
            UserWarning,
            stacklevel=2,
        )
    task.configure_optimizers = types.MethodType(ConfiguredOptimizers(optimizer, lr_scheduler), task)


def _call(node: dict[str, Any], where: str, expected: Any, first: Any) -> Any:
    make = instantiate({**node, PARTIAL: True}, where, expected=expected)  # checked before it is called
    try:
        return make(first)
    except Exception as e:
        raise ConfigError(f"{where}: building {node[TARGET]} failed: {type(e).__name__}: {e}") from e
