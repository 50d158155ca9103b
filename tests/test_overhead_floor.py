"""The floor contender of benchmarks/overhead.py does the work it claims: it trains as the raw closure loop
does and writes real TensorBoard events, so that its per-step cost is a floor of the contract, not of less."""

from __future__ import annotations

import glob
import os

import torch
from torch.utils.data import DataLoader

from benchmarks.overhead_models import TinyNet, run_floor, run_raw_closure


def _batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [TinyNet.batch(g) for _ in range(n)]


def test_floor_trains_as_the_raw_closure_loop_and_writes_a_tensorboard_event_every_50_steps(tmp_path):
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    batches = _batches(120)
    torch.manual_seed(0)
    raw, floor = TinyNet(), TinyNet()
    floor.load_state_dict(raw.state_dict())
    run_raw_closure(raw, DataLoader(batches, batch_size=None), "")
    run_floor(floor, DataLoader(batches, batch_size=None), str(tmp_path / "floor"), lookups=True)
    for a, b in zip(raw.parameters(), floor.parameters()):
        assert torch.equal(a, b)
    (path,) = glob.glob(os.path.join(tmp_path, "floor", "events.out.tfevents.*"))
    scalars = [(e.step, v.tag, v.simple_value) for e in EventFileLoader(path).Load() for v in e.summary.value]
    assert [(step, tag) for step, tag, _ in scalars] == [(50, "train/loss"), (100, "train/loss")]
    assert all(torch.isfinite(torch.tensor(value)) for _, _, value in scalars)
