"""Which samples each prediction batch holds (Lightning's predict batch indices, for BasePredictionWriter)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch.utils.data import Sampler

from strategies.data.reinit import rebuild, rebuildable


class IndexBatchSampler(Sampler[list[int]]):
    """Wraps a batch sampler and keeps every batch of dataset indices it yields, in order (the loader may
    read ahead, so batch i's indices are ``seen[i]``, not the last ones drawn)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.seen: list[list[int]] = []

    def __iter__(self) -> Iterator[list[int]]:
        self.seen = []
        for indices in self.inner:
            self.seen.append(list(indices))
            yield indices

    def __len__(self) -> int:
        return len(self.inner)


def track_indices(loader: Any) -> Any:
    """The loader drawing its batches through an IndexBatchSampler, when it can be rebuilt (else as it is)."""
    if rebuildable(loader) and loader.batch_sampler is not None:
        return rebuild(loader, batch_sampler=IndexBatchSampler(loader.batch_sampler))
    return loader


def batch_indices(loader: Any, batch_idx: int) -> list[int] | None:
    """The dataset indices of batch `batch_idx` of `loader`'s current pass, or None when unknown."""
    sampler = getattr(loader, "batch_sampler", None)
    if isinstance(sampler, IndexBatchSampler) and batch_idx < len(sampler.seen):
        return sampler.seen[batch_idx]
    return None
