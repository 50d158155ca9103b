"""One device: CUDA when present, else Apple's MPS, else the CPU."""

from __future__ import annotations

import torch

from strategies.base import Strategy, pick_device
from strategies.precision import Precision


class SingleDeviceStrategy(Strategy):
    """Run on one device. Example: ``Trainer(strategy="single", accelerator="cpu")``."""

    name = "single"

    def __init__(
        self, accelerator: str | None = None, precision: Precision | str | int | None = None, device: int = 0
    ) -> None:
        super().__init__(accelerator, precision)
        self.device_index = device

    @property
    def root_device(self) -> torch.device:
        """The one device this strategy computes on."""
        if self._root_device is None:
            self._root_device = pick_device(self.accelerator or "auto", self.device_index)
        return self._root_device
