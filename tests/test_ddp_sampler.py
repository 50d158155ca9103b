"""The samplers strategy='ddp' injects, seen through the indices each of two gloo ranks trains and
validates on: shards that are disjoint and complete (with DistributedSampler's padding), one permutation
shared by every rank, a new one each epoch, the seed of seed_everything, and order kept for unshuffled
and evaluation loaders."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from conftest import FAST, run_distributed
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from trainer import Task, Trainer, seed_everything

N, BATCH, EPOCHS = 13, 2, 3  # 13 samples do not split evenly over 2 ranks


class Indexed(Dataset):
    """Sample i is the number i, so that a step can tell which samples it got."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.tensor([float(i)]), torch.tensor([0.0])


class Recorder(Task):
    """Records the sample indices of every training and validation step, per epoch, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(1, 1)
        self.train_seen: list[list[int]] = [[] for _ in range(EPOCHS)]
        self.val_seen: list[list[int]] = [[] for _ in range(EPOCHS)]

    def training_step(self, batch, batch_idx):
        x, y = batch
        self.train_seen[self.current_epoch] += [int(v) for v in x[:, 0]]
        return (self.lin(x) - y).pow(2).mean()

    def validation_step(self, batch, batch_idx):
        self.val_seen[self.current_epoch] += [int(v) for v in batch[0][:, 0]]

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _fit(
    world_size: int, seed: int, shuffle: bool, drop_last: bool = False, batch_size: int = BATCH
) -> dict[str, list[list[int]]]:
    seed_everything(seed)
    task = Recorder()
    trainer = Trainer(strategy="ddp", devices=world_size, max_epochs=EPOCHS, **FAST)
    train = DataLoader(Indexed(), batch_size=batch_size, shuffle=shuffle, drop_last=drop_last)
    trainer.fit(task, train, DataLoader(Indexed(), batch_size=BATCH))
    return {"train": task.train_seen, "val": task.val_seen}


def _all_runs(rank: int, world_size: int) -> dict[str, Any]:
    """Every run in the same two processes (a process start costs seconds)."""
    return {
        "seed1": _fit(world_size, 1, shuffle=True),
        "seed1_again": _fit(world_size, 1, shuffle=True),
        "seed2": _fit(world_size, 2, shuffle=True),
        "ordered": _fit(world_size, 1, shuffle=False),
        # as in Lightning, the sampler pads (7 per rank) and the loader's drop_last drops each rank's last batch
        "drop_last": _fit(world_size, 1, shuffle=True, drop_last=True, batch_size=2),
    }


def interleave(per_rank: list[list[int]]) -> list[int]:
    """The global index list a DistributedSampler splits as global[rank::world_size]."""
    out = [0] * sum(len(r) for r in per_rank)
    for rank, seen in enumerate(per_rank):
        out[rank :: len(per_rank)] = seen
    return out


def torch_reference(seed: int, epoch: int, shuffle: bool, drop_last: bool = False) -> list[list[int]]:
    """What torch's own DistributedSampler gives each rank for this seed and epoch."""
    out = []
    for rank in range(2):
        sampler = DistributedSampler(
            Indexed(), num_replicas=2, rank=rank, shuffle=shuffle, seed=seed, drop_last=drop_last
        )
        sampler.set_epoch(epoch)
        out.append(list(sampler))
    return out


@pytest.fixture(scope="module")
def runs() -> list[dict[str, Any]]:
    """One two-process run serves every test of this file."""
    return run_distributed(_all_runs)


def per_rank(runs: list[dict[str, Any]], run: str, epoch: int, stage: str = "train") -> list[list[int]]:
    """What each rank saw of `run` in `epoch` (stage "train" or "val")."""
    return [runs[rank][run][stage][epoch] for rank in range(2)]


def test_training_shards_are_one_shared_permutation_per_epoch(runs):
    for run, seed in (("seed1", 1), ("seed2", 2)):
        orders = []
        for epoch in range(EPOCHS):
            ranks = per_rank(runs, run, epoch)
            order = interleave(ranks)
            # 14 slots for 13 samples: one permutation shared by both ranks, padded with its first index
            assert len(ranks[0]) == len(ranks[1]) == 7
            assert sorted(order[:N]) == list(range(N)), order
            assert order[N:] == order[:1]
            assert set(ranks[0]) & set(ranks[1]) == {order[0]}  # disjoint but for the padding
            assert ranks == torch_reference(seed, epoch, shuffle=True)
            orders.append(order)
        assert orders[0] != list(range(N)) + [0]  # a shuffled loader is shuffled
        assert len({tuple(o) for o in orders}) == EPOCHS  # a new permutation every epoch (set_epoch)


def test_seed_everything_sets_the_permutation(runs):
    for epoch in range(EPOCHS):
        assert per_rank(runs, "seed1", epoch) == per_rank(runs, "seed1_again", epoch)  # reproducible
        assert per_rank(runs, "seed1", epoch) != per_rank(runs, "seed2", epoch)  # another seed, another order


def test_unshuffled_and_drop_last_loaders(runs):
    for epoch in range(EPOCHS):
        # an unshuffled loader keeps the data set's order, padded the same way, in every epoch
        assert interleave(per_rank(runs, "ordered", epoch)) == list(range(N)) + [0]
        # drop_last: the padded shards of 7, less each rank's incomplete last batch (Lightning's split)
        dropped = per_rank(runs, "drop_last", epoch)
        assert len(dropped[0]) == len(dropped[1]) == 6
        assert dropped == [shard[:6] for shard in torch_reference(1, epoch, shuffle=True)]


def test_evaluation_shards_hold_every_sample_exactly_once(runs):
    for run in ("seed1", "ordered", "drop_last"):
        for epoch in range(EPOCHS):
            ranks = per_rank(runs, run, epoch, "val")
            assert ranks == [list(range(0, N, 2)), list(range(1, N, 2))]  # in order, unpadded, every epoch
