"""strategies/memory/measure.py's allocation_peak against tensors of known sizes: what torch's CPU allocator holds
at once, on every thread (the profiler's records, used before, saw only the profiled thread), counting only what
the block allocated (an earlier tensor freed inside it does not lower the count: the profiler's did), FSDP's way
of freeing and refilling a storage (resize_), and not memory maps (they are not allocations)."""

from __future__ import annotations

import threading

import pytest
import torch

from strategies.memory.measure import allocation_peak
from tandem_core.errors import ConfigError

MB = 2**20


def test_the_peak_of_what_the_block_allocated_on_any_thread(tmp_path):
    with allocation_peak() as earlier:
        before = torch.empty(4 * MB, dtype=torch.uint8)
    assert earlier.bytes == earlier.end == 4 * MB
    kept: list[torch.Tensor] = []
    with allocation_peak() as peak:
        del before  # made in an earlier block: its free is not this block's
        a = torch.empty(3 * MB, dtype=torch.uint8)
        worker = threading.Thread(target=lambda: kept.append(torch.ones(5 * MB, dtype=torch.uint8)))
        worker.start()
        worker.join()
        del a
        storage = torch.empty(MB, dtype=torch.uint8).untyped_storage()
        storage.resize_(3 * MB)  # (a copy: 1 + 3 MB at once, beside the thread's 5)
        storage.resize_(0)
    assert peak.bytes == 9 * MB  # the thread's 5 MB and the resize's 1 + 3
    assert peak.end == 5 * MB  # the thread's tensor, still held

    torch.save(torch.zeros(MB), tmp_path / "w.pt")
    with allocation_peak() as peak:
        mapped = torch.load(tmp_path / "w.pt", mmap=True, weights_only=True)
        assert mapped.sum() == 0
    assert (
        peak.bytes < 4096
    )  # the map is not allocated through the allocator (only the loader's small objects)


def test_blocks_do_not_nest():
    with allocation_peak():
        with pytest.raises(ConfigError, match="do not nest"):
            with allocation_peak():
                pass
