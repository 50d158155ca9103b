"""Measuring memory for real: the bytes torch's CPU allocator holds (every tensor's storage, as
``torch.cuda.max_memory_allocated`` counts on a GPU), and the process's resident set from the kernel.

`allocation_peak` counts at the allocator itself (strategies/memory/allocator.py: every allocation and free, on
every thread, gloo's workers included); the peak is the most bytes held at once by what was allocated inside the
block. `vm_hwm` is the kernel's high-water mark of the resident set (/proc/self/status VmHWM): it also holds the
interpreter, torch's libraries and whatever malloc keeps; `reset_hwm` lowers it to the current resident set
(Linux's clear_refs), to measure one phase of a process.
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


_measuring = False


@contextlib.contextmanager
def allocation_peak() -> Iterator[Peak]:
    """The most bytes torch's CPU allocator held at once inside the block, of what was allocated inside it (a
    tensor made before the block and freed inside it does not lower the count). One block at a time."""
    global _measuring
    import gc

    from strategies.memory.allocator import counting_allocator
    from tandem_core.errors import ConfigError

    if _measuring:
        raise ConfigError("allocation_peak() blocks do not nest: measure one block at a time.")
    lib = counting_allocator()
    gc.collect()  # (an earlier block's garbage freed now, not at some point inside this one)
    found = Peak()
    _measuring = True
    lib.tandem_begin()
    try:
        yield found
    finally:
        found.bytes, found.end = lib.tandem_peak(), lib.tandem_held()
        _measuring = False


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
