"""Timing work on a device: the host clock on the CPU, CUDA events on a GPU.

On a GPU the host only queues kernels, so ``time.perf_counter()`` around them measures their launch, not their
work. `timer_for(device)` gives a `Timer` whose `mark()` is taken in the device's order of work (a recorded
``torch.cuda.Event`` on CUDA: no wait) and whose `seconds(a, b)` is the time between two marks (on CUDA it
waits for `b` to have happened, so read it when the result is needed, not in a step). Example::

    timer = timer_for(device)
    start = timer.mark(); run(); end = timer.mark()
    timer.seconds(start, end)
"""

from __future__ import annotations

import time
from typing import Any

import torch

__all__ = ["CudaTimer", "HostTimer", "Timer", "timer_for"]


class Timer:
    """Marks in the order of a device's work, and the seconds between two of them."""

    def mark(self) -> Any:
        """A point in time, in the order of the device's work."""
        raise NotImplementedError

    def seconds(self, start: Any, end: Any) -> float:
        """Seconds from mark `start` to mark `end`."""
        raise NotImplementedError

    def since(self, start: Any) -> float:
        """Seconds from mark `start` to now (a new mark)."""
        return self.seconds(start, self.mark())


class HostTimer(Timer):
    """The host's monotonic clock: right where the host does the work itself (the CPU)."""

    def mark(self) -> float:
        return time.perf_counter()

    def seconds(self, start: float, end: float) -> float:
        return end - start


class CudaTimer(Timer):
    """CUDA events recorded on the current stream of `device`: the GPU's own clock."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def mark(self) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def seconds(self, start: torch.cuda.Event, end: torch.cuda.Event) -> float:
        end.synchronize()  # elapsed_time needs both events to have happened
        return start.elapsed_time(end) / 1e3  # milliseconds


def timer_for(device: torch.device | str) -> Timer:
    """A CudaTimer for a CUDA device, the host clock for anything else."""
    device = torch.device(device)
    return CudaTimer(device) if device.type == "cuda" else HostTimer()
