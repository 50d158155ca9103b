"""One device: CUDA when present, else Apple's MPS, else the CPU."""

from __future__ import annotations

import torch

from strategies.base import Strategy
from strategies.precision import Precision
from trainer.errors import ConfigError


def pick_device(accelerator: str = "auto", index: int = 0) -> torch.device:
    """Resolve 'auto' | 'cpu' | 'cuda' | 'gpu' | 'mps' to a torch.device, with a clear error if absent."""
    acc = {"gpu": "cuda"}.get(accelerator, accelerator)
    if acc == "auto":
        if torch.cuda.is_available():
            acc = "cuda"
        elif getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            acc = "mps"
        else:
            acc = "cpu"
    if acc == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            "accelerator='cuda' was requested but no CUDA GPU is visible; use accelerator='cpu'."
        )
    if acc == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ConfigError("accelerator='mps' was requested but MPS is not available; use accelerator='cpu'.")
    if acc not in ("cpu", "cuda", "mps"):
        raise ConfigError(f"unknown accelerator {accelerator!r} (valid: 'auto', 'cpu', 'cuda', 'gpu', 'mps')")
    return torch.device(acc, index) if acc == "cuda" else torch.device(acc)


class SingleDeviceStrategy(Strategy):
    """Run on one device. Example: ``Trainer(strategy="single", accelerator="cpu")``."""

    name = "single"

    def __init__(
        self, accelerator: str = "auto", precision: Precision | str | int = "32-true", device: int = 0
    ) -> None:
        super().__init__(accelerator, precision)
        self._root_device = pick_device(accelerator, device)
