"""strategies/sharding.py and strategies/data/reinit.py: each process's shard of a loader of any class.

The reference is torch's own DistributedSampler on a plain DataLoader: a DataLoader subclass (PyG-style,
with its own __init__) must give each rank exactly those indices, epoch by epoch; what cannot be rebuilt is
a LoaderError naming the class. One process under DDP draws the DistributedSampler's order, as Lightning.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest
import torch
from conftest import FAST, run_distributed
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, Dataset, DistributedSampler, IterableDataset, Sampler

from strategies.data.reinit import LoaderError, recording_init_args
from strategies.sharding import SamplerShards, ShardSampler, shard_loader
from trainer import Task, Trainer, seed_everything
from trainer.loop.data import set_epoch

N, BATCH, EPOCHS = 13, 2, 3


class Indexed(Dataset):
    """Sample i is the number i."""

    def __init__(self, n: int = N) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([float(i)])


class GraphLoader(DataLoader):
    """Like PyG's DataLoader: its own signature, its own collate function, **kwargs passed on."""

    def __init__(self, dataset, batch_size=1, shuffle=False, follow_batch=None, **kwargs):
        kwargs.pop("collate_fn", None)  # PyG sets its own
        self.follow_batch = follow_batch
        super().__init__(dataset, batch_size, shuffle, collate_fn=self.collate, **kwargs)

    def collate(self, items: list[torch.Tensor]) -> torch.Tensor:
        return torch.stack(items) + (0 if self.follow_batch is None else 0)


class Opaque(DataLoader):
    """Keeps no attribute for its `size` argument: rebuildable only from the record of its arguments."""

    def __init__(self, dataset, size, **kwargs):
        super().__init__(dataset, batch_size=size, **kwargs)


def indices(loader: Any) -> list[int]:
    return [int(v) for batch in loader for v in batch.reshape(-1)]


def torch_split(shuffle: bool, epoch: int, seed: int = 0, world: int = 2, n: int = N) -> list[list[int]]:
    out = []
    for rank in range(world):
        sampler = DistributedSampler(Indexed(n), num_replicas=world, rank=rank, shuffle=shuffle, seed=seed)
        sampler.set_epoch(epoch)
        out.append(list(sampler))
    return out


@pytest.mark.parametrize("shuffle", [True, False])
def test_a_subclass_is_split_as_torch_splits_a_plain_loader(shuffle):
    loader = GraphLoader(Indexed(), batch_size=BATCH, shuffle=shuffle, follow_batch=["x"])
    shards = [shard_loader(loader, "train", rank, 2, seed=5) for rank in range(2)]
    for shard in shards:
        assert type(shard) is GraphLoader and shard.follow_batch == ["x"] and shard.batch_size == BATCH
    for epoch in range(EPOCHS):
        for shard in shards:
            set_epoch(shard, epoch)
        assert [indices(s) for s in shards] == torch_split(shuffle, epoch, seed=5)


def test_evaluation_shards_of_a_subclass_are_unpadded():
    loader = GraphLoader(Indexed(), batch_size=BATCH)
    assert [indices(shard_loader(loader, "val", r, 2, 0)) for r in range(2)] == [
        list(range(0, N, 2)),
        list(range(1, N, 2)),
    ]


def test_a_subclass_made_in_a_hook_is_rebuilt_from_its_recorded_arguments():
    with recording_init_args():
        loader = Opaque(Indexed(), 3)
    assert Opaque.__init__.__name__ == "__init__" and "_tandem_init_args" not in vars(Opaque)
    shard = shard_loader(loader, "train", 1, 2, seed=0)
    assert type(shard) is Opaque and shard.batch_size == 3
    assert isinstance(shard.sampler, DistributedSampler) and shard.sampler.rank == 1


def test_a_subclass_that_cannot_be_rebuilt_is_refused_by_name():
    with pytest.raises(LoaderError, match=r"Opaque takes \['size'\].*use_distributed_sampler=False"):
        shard_loader(Opaque(Indexed(), 3), "train", 0, 2, seed=0)

    class Deaf(DataLoader):
        def __init__(self, dataset, **kwargs):
            kwargs.pop("sampler", None)  # drops the sampler it is given: would train on everything
            super().__init__(dataset, **kwargs)

    with pytest.raises(LoaderError, match="Deaf was rebuilt but does not use the sampler"):
        shard_loader(Deaf(Indexed(), batch_size=2), "train", 0, 2, seed=0)

    class Fixed(DataLoader):
        def __init__(self, dataset):
            super().__init__(dataset, batch_size=2)

    with pytest.raises(LoaderError, match=r"Fixed has no __init__ parameter .*\['batch_sampler', 'sampler'"):
        shard_loader(Fixed(Indexed()), "train", 0, 2, seed=0)


class Reversed(Sampler[int]):
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        return iter(range(self.n - 1, -1, -1))

    def __len__(self) -> int:
        return self.n


def test_a_custom_sampler_is_wrapped_not_replaced():
    loader = DataLoader(Indexed(), batch_size=BATCH, sampler=Reversed(N))
    shards = [shard_loader(loader, "train", r, 2, seed=3) for r in range(2)]
    drawn = list(Reversed(N))
    for epoch in range(2):
        for s in shards:
            set_epoch(s, epoch)
        positions = torch_split(True, epoch, seed=3)  # the positions of the draw, split as torch splits
        assert [indices(s) for s in shards] == [[drawn[i] for i in p] for p in positions]
    evals = [indices(shard_loader(loader, "test", r, 2, 0)) for r in range(2)]
    assert evals == [drawn[0::2], drawn[1::2]]
    assert len(SamplerShards(Reversed(N), 2, 0, True, 0)) == 7


class Buckets(BatchSampler):
    """A custom batch sampler with BatchSampler's signature (e.g. bucketing by length)."""


class Fixed:
    """A batch sampler that only yields fixed batches: nothing to rebuild it from."""

    def __iter__(self):
        return iter([[0, 1], [2, 3]])

    def __len__(self) -> int:
        return 2


def test_custom_batch_samplers():
    from torch.utils.data import RandomSampler

    loader = DataLoader(Indexed(), batch_sampler=Buckets(RandomSampler(Indexed()), 4, False))
    shards = [shard_loader(loader, "train", r, 2, seed=1) for r in range(2)]
    assert all(type(s.batch_sampler) is Buckets and s.batch_sampler.batch_size == 4 for s in shards)
    assert [indices(s) for s in shards] == torch_split(True, 0, seed=1)
    with pytest.raises(LoaderError, match="batch sampler Fixed"):
        shard_loader(DataLoader(Indexed(), batch_sampler=Fixed()), "train", 0, 2, seed=0)


def test_loaders_left_alone():
    class Stream(IterableDataset):
        def __iter__(self):
            return iter(range(4))

    stream = DataLoader(Stream())
    with pytest.warns(UserWarning, match="every process iterates all of it"):
        assert shard_loader(stream, "train", 0, 2, 0) is stream
    with pytest.warns(UserWarning, match="not a torch DataLoader"):
        assert shard_loader([1, 2], "train", 0, 2, 0) == [1, 2]
    mine = DataLoader(Indexed(), sampler=ShardSampler(N, 0, 2))
    assert shard_loader(mine, "train", 0, 2, 0) is mine  # the user shards already


class Recorder(Task):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(1, 1)
        self.seen: list[list[int]] = [[] for _ in range(EPOCHS)]

    def training_step(self, batch, batch_idx):
        self.seen[self.current_epoch] += [int(v) for v in batch.reshape(-1)]
        return self.lin(batch).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _fit_subclass(rank: int, world: int) -> list[list[int]]:
    seed_everything(7)
    task = Recorder()
    Trainer(strategy="ddp", devices=world, max_epochs=EPOCHS, **FAST).fit(
        task, GraphLoader(Indexed(), batch_size=BATCH, shuffle=True, follow_batch=["x"])
    )
    return task.seen


def test_one_process_ddp_draws_the_distributed_sampler_order():
    (seen,) = run_distributed(_fit_subclass, world_size=1)  # a process of its own: the group stays there
    assert seen == [torch_split(True, epoch, seed=7, world=1)[0] for epoch in range(EPOCHS)]


@pytest.mark.slow
def test_a_subclass_under_ddp_x2_is_split_as_torch_splits_a_plain_loader():
    ranks = run_distributed(_fit_subclass)
    for epoch in range(EPOCHS):
        assert [ranks[r][epoch] for r in range(2)] == torch_split(True, epoch, seed=7)


LIGHTNING_ORDER = """
import json, torch, pytorch_lightning as pl
from torch.utils.data import DataLoader, Dataset
class Indexed(Dataset):
    def __len__(self): return 13
    def __getitem__(self, i): return torch.tensor([float(i)])
class M(pl.LightningModule):
    def __init__(self):
        super().__init__(); self.lin = torch.nn.Linear(1, 1); self.seen = [[], [], []]
    def training_step(self, batch, batch_idx):
        self.seen[self.current_epoch] += [int(v) for v in batch.reshape(-1)]
        return self.lin(batch).pow(2).mean()
    def configure_optimizers(self): return torch.optim.SGD(self.parameters(), lr=0.01)
pl.seed_everything(7)
m = M()
pl.Trainer(strategy="ddp", devices=1, accelerator="cpu", max_epochs=3, logger=False, enable_checkpointing=False,
           enable_progress_bar=False, enable_model_summary=False).fit(m, DataLoader(Indexed(), 2, shuffle=True))
print("ORDER", json.dumps(m.seen))
"""


@pytest.mark.slow
def test_one_process_ddp_order_equals_lightnings():
    pytest.importorskip("pytorch_lightning", reason="the oracle: pip install -e '.[dev]'")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(LIGHTNING_ORDER)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd="/",  # Tandem's packages off the path
        env=dict(env, PYTHONPATH=""),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lightning = json.loads(out.stdout.split("ORDER", 1)[1])
    assert lightning == run_distributed(_fit_subclass, world_size=1)[0]
