"""Throughput: rolling batches, samples, items and FLOPs per second (and MFU), as Lightning's utility;
``measure_flops`` counts a step's FLOPs with torch.utils.flop_counter; peak FLOPs of common GPUs."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import torch

# dense (no sparsity) peak FLOP/s per device from NVIDIA's datasheets; "tfloat32": float32 matmuls on tensor cores
_PEAK: dict[str, dict[Any, float]] = {
    "h200": {torch.float32: 67e12, "tfloat32": 494.7e12, torch.bfloat16: 989.4e12, torch.float16: 989.4e12},
    "h100 sxm": {
        torch.float32: 66.9e12,
        "tfloat32": 494.7e12,
        torch.bfloat16: 989.4e12,
        torch.float16: 989.4e12,
    },
    "h100 pcie": {torch.float32: 51.2e12, "tfloat32": 378e12, torch.bfloat16: 756e12, torch.float16: 756e12},
    "a100": {torch.float32: 19.5e12, "tfloat32": 156e12, torch.bfloat16: 312e12, torch.float16: 312e12},
    "l4": {torch.float32: 30.3e12, "tfloat32": 60e12, torch.bfloat16: 121e12, torch.float16: 121e12},
    "a10g": {torch.float32: 31.2e12, "tfloat32": 62.5e12, torch.bfloat16: 125e12, torch.float16: 125e12},
    "v100": {torch.float32: 15.7e12, torch.float16: 125e12},
    "t4": {torch.float32: 8.1e12, torch.float16: 65e12},
}


def _chip(name: str) -> str | None:
    name = name.lower()
    if "h200" in name:
        return "h200"
    if "h100" in name:
        return "h100 pcie" if "pcie" in name else "h100 sxm"
    return next((chip for chip in ("a100", "a10g", "l4", "v100", "t4") if chip in name), None)


def get_available_flops(device: torch.device, dtype: torch.dtype) -> int | None:
    """The device's peak FLOP/s for `dtype` (None on a CPU or an unlisted GPU: no MFU then)."""
    if device.type != "cuda":
        return None
    table = _PEAK.get(_chip(torch.cuda.get_device_name(device)) or "")
    if table is None:
        return None
    if dtype is torch.float32 and torch.cuda.get_device_capability(device)[0] >= 8:
        if torch.get_float32_matmul_precision() != "highest":
            dtype = "tfloat32"  # type: ignore[assignment]
    flops = table.get(dtype)
    return None if flops is None else int(flops)


def measure_flops(
    model: torch.nn.Module,
    forward_fn: Callable[[], torch.Tensor],
    loss_fn: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> int:
    """FLOPs of ``forward_fn()`` (and of the backward of ``loss_fn(output)`` when given), counted by
    torch.utils.flop_counter.FlopCounterMode; use a model on the meta device to count without computing."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        if loss_fn is None:
            forward_fn()
        else:
            loss_fn(forward_fn()).backward()
    return counter.get_total_flops()


class _Monotonic(deque):
    """A window of totals that must not decrease (a reset counter is a caller's bug, said at once)."""

    def append(self, x: Any) -> None:
        if self and x < self[-1]:
            raise ValueError(f"Expected the value to increase, last: {self[-1]}, current: {x}")
        super().append(x)


class Throughput:
    """Rolling throughput over the last `window_size` updates: ``time``, ``batches``, ``samples`` (and
    ``lengths``) totals; ``device/batches_per_sec``, ``device/samples_per_sec``, ``device/items_per_sec``,
    ``device/flops_per_sec``, ``device/mfu`` (with `available_flops`); the same without ``device/`` summed over
    `world_size` processes when there are several. Example::

        tp = Throughput(window_size=10); tp.update(time=t, batches=i, samples=i * 32); tp.compute()
    """

    def __init__(
        self,
        available_flops: float | None = None,
        world_size: int = 1,
        window_size: int = 100,
        separator: str = "/",
    ) -> None:
        if world_size < 1 or window_size < 2:
            raise ValueError("Throughput needs world_size >= 1 and window_size >= 2.")
        self.available_flops, self.world_size, self.separator = available_flops, world_size, separator
        self._time: _Monotonic = _Monotonic(maxlen=window_size)
        self._batches: _Monotonic = _Monotonic(maxlen=window_size)
        self._samples: _Monotonic = _Monotonic(maxlen=window_size)
        self._lengths: _Monotonic = _Monotonic(maxlen=window_size)
        self._flops: deque[int] = deque(maxlen=window_size)

    def update(
        self, *, time: float, batches: int, samples: int, lengths: int | None = None, flops: int | None = None
    ) -> None:
        """Totals so far on this device (time in seconds); `flops`: this device's FLOPs since the last update."""
        self._time.append(time)
        if samples < batches:
            raise ValueError(f"Expected samples ({samples}) to be greater or equal than batches ({batches})")
        self._batches.append(batches)
        self._samples.append(samples)
        if lengths is not None:
            if lengths < samples:
                raise ValueError(
                    f"Expected lengths ({lengths}) to be greater or equal than samples ({samples})"
                )
            self._lengths.append(lengths)
            if len(self._samples) != len(self._lengths):
                raise RuntimeError("lengths must be given with every update once given")
        if flops is not None:
            self._flops.append(flops * self.world_size)

    def compute(self) -> dict[str, int | float]:
        """The totals, and the rates once the window is full."""
        sep = self.separator
        out: dict[str, int | float] = {
            "time": self._time[-1],
            "batches": self._batches[-1],
            "samples": self._samples[-1],
        }
        if self._lengths:
            out["lengths"] = self._lengths[-1]
        several = self.world_size > 1
        full = len(self._time) == self._time.maxlen
        elapsed = self._time[-1] - self._time[0]
        if full:
            batches_s = (self._batches[-1] - self._batches[0]) / elapsed
            samples_s = (self._samples[-1] - self._samples[0]) / elapsed
            out[f"device{sep}batches_per_sec"], out[f"device{sep}samples_per_sec"] = batches_s, samples_s
            if several:
                out["batches_per_sec"], out["samples_per_sec"] = (
                    batches_s * self.world_size,
                    samples_s * self.world_size,
                )
            if len(self._lengths) == self._lengths.maxlen:
                items_s = (self._lengths[-1] - self._lengths[0]) / elapsed
                out[f"device{sep}items_per_sec"] = items_s
                if several:
                    out["items_per_sec"] = items_s * self.world_size
        if len(self._flops) == self._flops.maxlen:
            flops_s = (
                sum(self._flops) - self._flops[0]
            ) / elapsed  # the first update's FLOPs precede the window
            if several:
                out["flops_per_sec"] = flops_s
            out[f"device{sep}flops_per_sec"] = flops_s / self.world_size
            if self.available_flops:
                out[f"device{sep}mfu"] = flops_s / self.world_size / self.available_flops
        return out

    def reset(self) -> None:
        for window in (self._time, self._batches, self._samples, self._lengths, self._flops):
            window.clear()
