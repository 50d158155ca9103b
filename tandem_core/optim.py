"""What configure_optimizers' schedulers become (trainer/loop/optim.py parses them; SWA adds its own)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class SchedulerConfig:
    """One learning-rate scheduler and when to step it (Lightning's keys)."""

    scheduler: Any
    interval: str = "epoch"
    frequency: int = 1
    monitor: str | None = None
    strict: bool = True
    name: str | None = None

    @property
    def is_plateau(self) -> bool:
        return isinstance(self.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
