"""Counting host reads of device values on a CPU: a tracer over the calls that, on a GPU, make the host wait for
the device (`.item()`, `.tolist()`, `.cpu()`, `.numpy()`, `bool()`/`int()`/`float()` of a tensor) and over
host values built on a device (`torch.tensor(..., device=...)`, `torch.as_tensor(..., device=...)`: a copy
from the host that waits too). On a CPU none of them waits, so each call is counted as the sync it would be.

    with HostSyncs() as syncs:
        ...               # syncs.count so far; syncs.where: the call sites (file:line) of each
"""

from __future__ import annotations

import collections
import sys
from typing import Any

import torch

_METHODS = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")
_FACTORIES = ("tensor", "as_tensor")


class HostSyncs:
    """Counts the calls while `armed` (True from entering, unless `armed=False` is given: a callback arms
    it for the steps it measures)."""

    def __init__(self, armed: bool = True) -> None:
        self.armed = armed
        self.count = 0
        self.where: collections.Counter[str] = collections.Counter()
        self._saved: list[tuple[Any, str, Any]] = []

    def _hit(self, name: str) -> None:
        if not self.armed:
            return
        self.count += 1
        frame = sys._getframe(2)  # the caller of the patched function
        self.where[f"{name} at {frame.f_code.co_filename}:{frame.f_lineno}"] += 1

    def __enter__(self) -> HostSyncs:
        tracer = self
        for name in _METHODS:
            real = getattr(torch.Tensor, name)

            def method(self_t: torch.Tensor, *a: Any, _real: Any = real, _name: str = name, **k: Any) -> Any:
                tracer._hit(_name)
                return _real(self_t, *a, **k)

            self._saved.append((torch.Tensor, name, real))
            setattr(torch.Tensor, name, method)
        for name in _FACTORIES:
            real = getattr(torch, name)

            def factory(*a: Any, _real: Any = real, _name: str = name, **k: Any) -> Any:
                if k.get("device") is not None:
                    tracer._hit(f"torch.{_name}(device=)")
                return _real(*a, **k)

            self._saved.append((torch, name, real))
            setattr(torch, name, factory)
        return self

    def __exit__(self, *exc: Any) -> None:
        for owner, name, real in reversed(self._saved):
            setattr(owner, name, real)
        self._saved.clear()
