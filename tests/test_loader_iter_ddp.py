"""The `dataloader_iter` step flavor under strategy="ddp" on two gloo ranks, in one spawn: each rank's step reads
two batches of its DistributedSampler shard, the ranks end with equal weights, equal to one process stepping on
both ranks' rows at once; a loader without a length is refused on every rank."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from test_lightning_parity_loader_iter import _data, _Stream, _task
from torch.utils.data import DataLoader

from tandem_core.errors import ConfigError
from trainer import Trainer


def _ddp_runs(rank: int, world_size: int) -> dict[str, Any]:
    from conftest import FAST

    torch.manual_seed(0)
    task = _task(False, fetches=2)
    Trainer(strategy="ddp", devices=2, max_epochs=1, **FAST).fit(task, _data(16))  # 8 batches per rank
    weights = [p.detach().clone() for p in task.layer.parameters()]
    refused = False
    try:
        Trainer(strategy="ddp", devices=2, max_epochs=1, **FAST).fit(
            _task(False, fetches=1), DataLoader(_Stream(3), batch_size=None)
        )
    except ConfigError:
        refused = True
    return {"weights": weights, "refused": refused, "reads": [s for s in task.seen if s[1] == "read"]}


@pytest.mark.slow
def test_ddp_two_ranks_each_read_their_shard() -> None:
    """ddp x2: each rank's step reads two batches of its DistributedSampler shard; the ranks end with the same
    weights, equal to one process stepping on both ranks' rows at once (the full batch); a loader without a
    length is refused on every rank (ConfigError) rather than left to hang."""
    from conftest import run_distributed

    results = run_distributed(_ddp_runs, timeout=180)
    rows = _data(16).dataset  # 32 rows; rank r gets rows r, r+2, ... in batches of 2
    torch.manual_seed(0)
    layer = torch.nn.Linear(4, 1)
    with torch.no_grad():
        layer.load_state_dict(_task(False).layer.state_dict())
    opt = torch.optim.SGD(layer.parameters(), lr=0.1)
    for step in range(4):  # each step: 4 rows per rank
        idx = [r + 2 * i for r in range(2) for i in range(4 * step, 4 * step + 4)]
        opt.zero_grad()
        layer(rows[idx]).pow(2).mean().backward()
        opt.step()
    for res in results:
        assert res["refused"]
        assert len(res["reads"]) == 8
        for a, b in zip(res["weights"], layer.parameters()):
            torch.testing.assert_close(a, b.detach())
