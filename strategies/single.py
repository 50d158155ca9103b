"""One device: CUDA when present, else Apple's MPS, else the CPU."""

from __future__ import annotations

from typing import Any

import torch

from strategies.base import Strategy, pick_device
from strategies.precision import Precision


class SingleDeviceStrategy(Strategy):
    """Run on one device. Example: ``Trainer(strategy="single", accelerator="cpu")``, or Lightning's form with the
    device first: ``SingleDeviceStrategy(torch.device("cuda", 1))``."""

    name = "single"

    def __init__(
        self,
        accelerator: str | None = None,
        precision: Precision | str | int | None = None,
        device: int | str | torch.device = 0,
        *,
        precision_plugin: Precision | None = None,
        checkpoint_io: Any = None,
    ) -> None:
        if isinstance(accelerator, torch.device) or (isinstance(accelerator, str) and ":" in accelerator):
            # Lightning's first argument is the device: SingleDeviceStrategy(torch.device("cpu")), ("cuda:1")
            accelerator, device = None, accelerator
        if isinstance(device, (str, torch.device)):  # Lightning's form: device="cpu", torch.device("cuda", 1)
            device = torch.device(device)
            if accelerator is None:
                accelerator = device.type
            device = device.index or 0
        super().__init__(
            accelerator, precision, precision_plugin=precision_plugin, checkpoint_io=checkpoint_io
        )
        self.device_index = device

    @property
    def root_device(self) -> torch.device:
        """The one device this strategy computes on."""
        if self._root_device is None:
            self._root_device = pick_device(self.accelerator or "auto", self.device_index)
        return self._root_device
