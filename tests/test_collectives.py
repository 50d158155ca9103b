"""Strategy collectives: exact results of reduce, all_gather, broadcast, gather_object and barrier on two gloo
ranks (checked against torch on the ranks' inputs), and their identity results on one process."""

from __future__ import annotations

import os
import time
from typing import Any

import pytest
import torch
from conftest import FAST

from tandem_core.errors import ConfigError
from trainer import Trainer


def comm(strategy: Any) -> Any:
    """The collectives of a strategy: `strategy.comm` once they move there, the strategy itself before."""
    return getattr(strategy, "comm", strategy)


def rank_input(rank: int) -> torch.Tensor:
    """A different tensor on each rank, with negative, zero and large entries: [1, 0, 1] and [2, -2, 10]."""
    return torch.tensor([1.0 + rank, -2.0 * rank, 10.0**rank])


def rank_block(rank: int) -> torch.Tensor:
    """A (2, 3) block that differs by rank."""
    return torch.arange(6.0).view(2, 3) + 100 * rank


def _collectives(rank: int, world_size: int, marker: str) -> dict[str, Any]:
    """Every collective once, through the strategy the Trainer resolves for strategy='ddp'."""
    c = comm(Trainer(strategy="ddp", devices=world_size, **FAST).strategy)
    x = rank_input(rank)
    out: dict[str, Any] = {op: c.reduce(x, op) for op in ("sum", "mean", "max", "min")}
    out["default"] = c.reduce(x)
    out["input_after"] = x.clone()  # reduce returns a new tensor and leaves its input alone
    try:
        c.reduce(x, "prod")
        out["bad_op"] = ""
    except ConfigError as e:
        out["bad_op"] = str(e)
    out["gathered"] = c.all_gather(rank_block(rank))
    out["gathered_scalar"] = c.all_gather(torch.tensor(5.0 * rank))
    out["from0"] = c.broadcast({"rank": rank, "t": torch.tensor([rank])}, src=0)
    out["from1"] = c.broadcast(f"from rank {rank}", src=1)
    out["from_default"] = c.broadcast(rank)
    out["objects"] = c.gather_object({"rank": rank, "items": list(range(rank + 1))})
    # barrier: rank 1 arrives late and leaves a marker just before; rank 0 must not pass the barrier before it
    if rank == 1:
        time.sleep(0.5)
        open(marker, "w").close()
    c.barrier("collectives test")
    out["marker_seen"] = os.path.exists(marker)
    return out


def test_collectives_on_two_ranks_give_exact_results(dist_run, tmp_path):
    results = dist_run(_collectives, str(tmp_path / "rank1_arrived"))
    inputs = torch.stack([rank_input(r) for r in range(2)])
    expected = {
        "sum": inputs.sum(0),
        "mean": inputs.mean(0),
        "max": inputs.max(0).values,
        "min": inputs.min(0).values,
    }
    expected["default"] = expected["mean"]  # Lightning's default op
    for rank, out in enumerate(results):
        for op, value in expected.items():
            assert torch.equal(out[op], value), (rank, op, out[op])
        assert torch.equal(out["input_after"], rank_input(rank))
        assert "'prod'" in out["bad_op"] and "'sum'" in out["bad_op"]  # names the bad op and the valid ones
        assert torch.equal(out["gathered"], torch.stack([rank_block(0), rank_block(1)]))  # (ranks, 2, 3)
        assert torch.equal(out["gathered_scalar"], torch.tensor([0.0, 5.0]))
        assert out["from0"]["rank"] == 0 and torch.equal(out["from0"]["t"], torch.tensor([0]))
        assert out["from1"] == "from rank 1"
        assert out["from_default"] == 0  # src defaults to rank 0
        assert out["objects"] == [{"rank": 0, "items": [0]}, {"rank": 1, "items": [0, 1]}]
        assert out["marker_seen"], f"rank {rank} passed the barrier before rank 1 reached it"


@pytest.mark.parametrize("strategy,devices", [("single", 1), ("dp", 2)])
def test_collectives_are_the_identity_on_one_process(strategy, devices):
    c = comm(Trainer(strategy=strategy, devices=devices, **FAST).strategy)
    x = rank_input(1)
    for op in ("sum", "mean", "max", "min"):
        assert torch.equal(c.reduce(x, op), x), op
    assert torch.equal(c.reduce(x), x)
    gathered = c.all_gather(rank_block(0))
    assert gathered.shape == (1, 2, 3) and torch.equal(gathered[0], rank_block(0))
    assert torch.equal(c.all_gather(torch.tensor(3.0)), torch.tensor([3.0]))
    obj = {"a": [1, 2]}
    assert c.broadcast(obj, src=0) == obj and c.broadcast(obj) == obj
    assert c.gather_object(obj) == [obj]
    assert c.barrier("one process") is None
