"""Throughput: rolling batches, samples, items and FLOPs per second (and MFU), as Lightning's utility;
``measure_flops`` counts a step's FLOPs with torch.utils.flop_counter; peak FLOPs of common GPUs."""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

# Dense (no sparsity) peak FLOP/s per GPU from NVIDIA's datasheets (their starred figures, with 2:4 sparsity,
# are halved); "tfloat32": float32 matmuls on tensor cores; float64: the FP64 tensor cores where a chip has them.
# (Lightning's table gives the L4's peak to the L40 and L40S, has no entry for "NVIDIA H200", and lists the H200
# and H100 NVL with sparsity.)
_T = 1e12
_PEAK: dict[str, dict[Any, float]] = {
    "h200 sxm": {
        torch.float64: 67 * _T,
        torch.float32: 67 * _T,
        "tfloat32": 494.7 * _T,
        torch.bfloat16: 989.4 * _T,
        torch.float16: 989.4 * _T,
    },
    "h200 nvl": {
        torch.float64: 60 * _T,
        torch.float32: 60 * _T,
        "tfloat32": 417.5 * _T,
        torch.bfloat16: 835.5 * _T,
        torch.float16: 835.5 * _T,
    },
    "h100 sxm": {
        torch.float64: 67 * _T,
        torch.float32: 66.9 * _T,
        "tfloat32": 494.7 * _T,
        torch.bfloat16: 989.4 * _T,
        torch.float16: 989.4 * _T,
    },
    "h100 pcie": {
        torch.float64: 51 * _T,
        torch.float32: 51.2 * _T,
        "tfloat32": 378 * _T,
        torch.bfloat16: 756 * _T,
        torch.float16: 756 * _T,
    },
    "h100 nvl": {
        torch.float64: 60 * _T,
        torch.float32: 60 * _T,
        "tfloat32": 417.5 * _T,
        torch.bfloat16: 835.5 * _T,
        torch.float16: 835.5 * _T,
    },
    "a100": {
        torch.float64: 19.5 * _T,
        torch.float32: 19.5 * _T,
        "tfloat32": 156 * _T,
        torch.bfloat16: 312 * _T,
        torch.float16: 312 * _T,
    },
    "l40s": {
        torch.float32: 91.6 * _T,
        "tfloat32": 183 * _T,
        torch.bfloat16: 362.05 * _T,
        torch.float16: 362.05 * _T,
    },
    "l40": {
        torch.float32: 90.5 * _T,
        "tfloat32": 90.5 * _T,
        torch.bfloat16: 181.05 * _T,
        torch.float16: 181.05 * _T,
    },
    "l4": {torch.float32: 30.3 * _T, "tfloat32": 60 * _T, torch.bfloat16: 121 * _T, torch.float16: 121 * _T},
    "a10g": {
        torch.float32: 31.2 * _T,
        "tfloat32": 62.5 * _T,
        torch.bfloat16: 125 * _T,
        torch.float16: 125 * _T,
    },
    "a10": {
        torch.float32: 31.2 * _T,
        "tfloat32": 62.5 * _T,
        torch.bfloat16: 125 * _T,
        torch.float16: 125 * _T,
    },
    "v100": {torch.float32: 15.7 * _T, torch.float16: 125 * _T},
    "t4": {torch.float32: 8.1 * _T, torch.float16: 65 * _T},
}


def _chip(name: str) -> str | None:
    """The table's key for a device name as torch.cuda.get_device_name gives it ("NVIDIA H100 80GB HBM3",
    "NVIDIA L40S", "NVIDIA A100-SXM4-80GB", "Tesla T4"), matched by whole model names: "l4" is not "l40s"."""
    words = set(re.split(r"[^a-z0-9]+", name.lower()))
    for model in ("h200", "h100"):
        if model in words:
            return (
                f"{model} nvl" if "nvl" in words else f"{model} pcie" if "pcie" in words else f"{model} sxm"
            )
    return next(
        (chip for chip in ("a100", "l40s", "l40", "l4", "a10g", "a10", "v100", "t4") if chip in words), None
    )


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
