"""Giving each process its shard of a loader (DDP, FSDP), as Lightning does: every map-style DataLoader,
of any class, is rebuilt with a distributed sampler, even in a group of one process (so that the shuffle
order is the DistributedSampler's, as in Lightning); what cannot be rebuilt is a clear error."""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from typing import Any

from torch.utils.data import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    Sampler,
    SequentialSampler,
)

from strategies.data.reinit import LoaderError, rebatch, reinstantiate


class ShardSampler(DistributedSampler):
    """Evaluation sampler: rank r takes every world_size-th index from r, no padding and no repeats,
    so metrics over all ranks count each sample exactly once (ranks may get one batch more or less).
    A DistributedSampler (as the one Lightning puts in an evaluation loader, which pads with repeats instead),
    so that code asking `isinstance(sampler, DistributedSampler)` learns the loader is sharded."""

    def __init__(self, length: int, rank: int, world_size: int) -> None:
        super().__init__(range(length), num_replicas=world_size, rank=rank, shuffle=False)  # type: ignore[arg-type]
        self.indices = range(rank, length, world_size)
        self.num_samples, self.total_size = len(self.indices), length

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


class SamplerShards(Sampler[Any]):
    """Rank `rank`'s share of what a custom sampler (weighted, grouped by length, ...) draws each epoch.

    Training (`pad=True`): the positions of the drawn list are split exactly as torch's DistributedSampler
    splits a data set of that length (shuffled with seed + epoch, padded to a multiple of the world size),
    as Lightning's sampler wrapper does. Evaluation (`pad=False`): every world_size-th draw, unpadded.
    """

    def __init__(
        self, inner: Any, num_replicas: int, rank: int, shuffle: bool, seed: int, pad: bool = True
    ) -> None:
        self.inner, self.num_replicas, self.rank = inner, num_replicas, rank
        self.shuffle, self.seed, self.pad, self.epoch = shuffle, seed, pad, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[Any]:
        drawn = list(self.inner)  # one epoch of the user's sampler, drawn anew each time
        if not self.pad:
            return iter(drawn[self.rank :: self.num_replicas])
        split = DistributedSampler(
            range(len(drawn)),  # type: ignore[arg-type]  (it only needs a length)
            num_replicas=self.num_replicas,
            rank=self.rank,
            shuffle=self.shuffle,
            seed=self.seed,
        )
        split.set_epoch(self.epoch)
        return iter([drawn[i] for i in split])

    def __len__(self) -> int:
        n = len(self.inner)
        if self.pad:
            return math.ceil(n / self.num_replicas)
        return len(range(self.rank, n, self.num_replicas))


def _shards_already(loader: DataLoader) -> bool:
    """The user shards the data already (a distributed sampler, possibly inside their batch sampler)."""
    mine = (DistributedSampler, ShardSampler, SamplerShards)
    inner = getattr(loader.batch_sampler, "sampler", None)
    return isinstance(loader.sampler, mine) or isinstance(inner, mine)


def _unshardable(loader: Any, why: str) -> None:
    warnings.warn(
        f"{type(loader).__name__}: {why}, so Tandem gives no process a shard of it: every process iterates "
        "all of it. Make it yield a different part on each rank (torch.distributed.get_rank()), or pass "
        "Trainer(use_distributed_sampler=False) to say you shard it yourself.",
        UserWarning,
        stacklevel=3,
    )


def shard_loader(loader: Any, stage: str, rank: int, world: int, seed: int, overfit: bool = False) -> Any:
    """`loader` rebuilt to yield rank `rank`'s shard in `stage` ("train", "val", "test", "predict")."""
    if not isinstance(loader, DataLoader):
        if world > 1:
            _unshardable(loader, "not a torch DataLoader, it has no sampler to replace")
        return loader
    if isinstance(loader.dataset, IterableDataset):
        if world > 1:
            _unshardable(loader, "its IterableDataset has no sampler to replace")
        return loader
    if _shards_already(loader):
        return loader
    sampler: Sampler[Any]
    batches = loader.batch_sampler
    custom_batches = batches is not None and type(batches) is not BatchSampler
    if stage == "train":
        # torch's DistributedSampler without drop_last (the loader's drop_last drops batches), as Lightning;
        # a plain loader is shuffled when it was (Lightning always shuffles: see docs/porting.md)
        drawn_by = getattr(batches, "sampler", None) if custom_batches else loader.sampler
        if isinstance(loader.sampler, (RandomSampler, SequentialSampler)):
            shuffle = isinstance(drawn_by, RandomSampler) and not overfit
            sampler = DistributedSampler(
                loader.dataset, num_replicas=world, rank=rank, shuffle=shuffle, seed=seed
            )
        else:  # a custom sampler: its draws are split as Lightning's wrapper splits them (shuffled)
            sampler = SamplerShards(loader.sampler, world, rank, shuffle=not overfit, seed=seed)
    elif isinstance(loader.sampler, (RandomSampler, SequentialSampler)):
        sampler = ShardSampler(len(loader.dataset), rank, world)  # type: ignore[arg-type]
    else:
        sampler = SamplerShards(loader.sampler, world, rank, shuffle=False, seed=seed, pad=False)
    if not custom_batches:
        return reinstantiate(loader, sampler=sampler)
    # a custom batch sampler: rebuilt over the distributed sampler with its batch_size and drop_last
    rebuilt = rebatch(batches, sampler)
    if rebuilt is None:
        raise LoaderError(
            f"cannot give each process its shard of the data: the batch sampler "
            f"{type(batches).__name__} of this {type(loader).__name__} cannot be rebuilt over a distributed "
            "sampler. Give it torch BatchSampler's signature (sampler, batch_size, drop_last) and keep them "
            "as attributes, or shard inside it and pass Trainer(use_distributed_sampler=False)."
        )
    return reinstantiate(loader, batch_sampler=rebuilt)
