"""Measuring memory for real: the bytes torch's CPU allocator holds (every tensor's storage, as
``torch.cuda.max_memory_allocated`` counts on a GPU), and the process's resident set from the kernel.

`allocation_peak` reads the allocator's own records through torch's profiler (``profile_memory=True``: one event
per allocation and free, with its size); the peak is the largest running sum from the start of the block, so
start it before anything worth counting is allocated. `vm_hwm` is the kernel's high-water mark of the resident
set (/proc/self/status VmHWM): it also holds the interpreter, torch's libraries and whatever malloc keeps;
`reset_hwm` lowers it to the current resident set (Linux's clear_refs), to measure one phase of a process.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass
class Peak:
    """Filled when the block ends: `bytes` at the peak, `end` held at the end (both from the block's start)."""

    bytes: int = 0
    end: int = 0


@contextlib.contextmanager
def allocation_peak() -> Iterator[Peak]:
    """The most bytes torch's CPU allocator held at once inside the block, counted from its start."""
    from torch.profiler import ProfilerActivity, profile

    found = Peak()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        yield found
    events = sorted(
        (e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"
    )
    held = 0
    for _, nbytes in events:
        held += nbytes
        found.bytes = max(found.bytes, held)
    found.end = held


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise OSError(f"/proc/self/status has no {field}")


def vm_hwm() -> int:
    """This process's peak resident set size in bytes (Linux)."""
    return _status("VmHWM")


def vm_rss() -> int:
    """This process's resident set size in bytes now (Linux)."""
    return _status("VmRSS")


def reset_hwm() -> None:
    """Lower this process's VmHWM to its current resident set (Linux: writing 5 to /proc/self/clear_refs),
    after handing memory malloc keeps but no longer uses back to the system (glibc's malloc_trim): without
    that, memory freed by an earlier phase is reused without raising the resident set, and a phase measures
    less than it holds."""
    import ctypes
    import ctypes.util
    import gc

    gc.collect()
    libc = ctypes.util.find_library("c")
    if libc is not None:
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(libc).malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
