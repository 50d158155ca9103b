"""DataLoaders in the loop: counting and limiting batches, worker seeding, epochs, resuming mid-epoch (rebuilding
a loader with another sampler is strategies/data/reinit.py)."""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from itertools import islice
from typing import Any

from torch.utils.data import BatchSampler, Sampler, SequentialSampler

from strategies.data.reinit import rebuild, rebuildable
from tandem_core.errors import ConfigError, TaskError
from trainer.seed import worker_init_fn
from trainer.utilities.combined_loader import CombinedLoader


def num_batches(loader: Any, limit: int | float) -> int | float:
    """How many batches an epoch takes from `loader` under limit_*_batches (inf when unknown); a CombinedLoader's
    count under its mode, its limits set per inner loader (loop/combined.py)."""
    if isinstance(loader, CombinedLoader):
        return loader.num_batches()
    try:
        n: int | float = len(loader)
    except (
        TypeError,
        NotImplementedError,
    ):  # no length, or one that says it has none (as Lightning reads it)
        n = float("inf")
    if isinstance(limit, bool) or limit < 0:
        raise ConfigError(f"limit_*_batches must be an int >= 0 or a float in [0, 1], got {limit!r}.")
    if isinstance(limit, int):
        return min(n, limit)
    if limit > 1.0:
        raise ConfigError(
            f"a fractional limit_*_batches must be in [0, 1], got {limit}; pass an int for a count."
        )
    if n == float("inf"):
        if limit == 1.0:
            return n
        raise ConfigError("limit_*_batches as a fraction needs a loader with a length; pass an int instead.")
    out = int(n * limit)
    if out == 0 and limit > 0 and n > 0:  # a small fraction of a short loader: not silently zero batches
        raise ConfigError(
            f"limit_*_batches={limit} of a loader with {n} batches is less than one batch; "
            f"pass at least {1 / n:.4g} or an int."
        )
    return out


def with_worker_seeding(loader: Any) -> Any:
    """Add our worker_init_fn when seed_everything(workers=True) asked for it and none is set."""
    if (
        os.environ.get("TANDEM_SEED_WORKERS") == "1"
        and rebuildable(loader)
        and loader.num_workers > 0
        and loader.worker_init_fn is None
    ):
        return rebuild(loader, worker_init_fn=worker_init_fn)
    return loader


def set_epoch(loader: Any, epoch: int) -> None:
    """Tell epoch-aware samplers (DistributedSampler) the epoch so that each epoch shuffles anew."""
    if isinstance(loader, CombinedLoader):
        for inner in loader.flattened:
            set_epoch(inner, epoch)
        return
    batch_sampler = getattr(loader, "batch_sampler", None)
    found = (getattr(loader, "sampler", None), batch_sampler, getattr(batch_sampler, "sampler", None))
    # once each: the loader's sampler is usually also its batch sampler's (Lightning calls it once too)
    for sampler in {id(s): s for s in found if s is not None and hasattr(s, "set_epoch")}.values():
        sampler.set_epoch(epoch)


class SkipBatchSampler(Sampler[list[int]]):
    """Yields the batches of `inner` after the first `skip`, drawing only indices for the skipped ones.

    `prime()` runs the inner sampler up to the first kept batch, so its random draw happens at a moment
    the caller chooses (right after the DataLoader iterator took its own seed, as in an uninterrupted run).
    """

    def __init__(self, inner: BatchSampler | Any, skip: int) -> None:
        self.inner, self.skip = inner, skip
        self._it: Iterator[list[int]] | None = None
        self._primed = False

    def __iter__(self) -> Iterator[list[int]]:
        self._it, self._primed = iter(self.inner), False
        return self

    def prime(self) -> None:
        if not self._primed and self._it is not None:
            for _ in islice(self._it, self.skip):
                pass
            self._primed = True

    def __next__(self) -> list[int]:
        self.prime()
        assert self._it is not None
        return next(self._it)

    def __len__(self) -> int:
        return max(len(self.inner) - self.skip, 0)


def shutdown_workers(loaders: list[Any]) -> None:
    """End the worker processes a `persistent_workers=True` loader keeps between epochs, at the end of a stage
    (as Lightning does, failed or not): they would otherwise live, with their copies of the data set, as long as
    the loader object does (in a notebook, for good). The next stage starts new ones."""
    for loader in loaders:
        for dl in loader.flattened if isinstance(loader, CombinedLoader) else [loader]:
            it = getattr(dl, "_iterator", None)  # where torch's DataLoader keeps its persistent iterator
            if it is not None and callable(getattr(it, "_shutdown_workers", None)):
                it._shutdown_workers()
                dl._iterator = None


def unshuffled(loader: Any, phase: str) -> Any:
    """The loader with its samples in order (overfit_batches): a loader whose sampler is not sequential is rebuilt
    with a SequentialSampler, with a warning (Lightning's); one that cannot be rebuilt is refused."""
    sampler = getattr(loader, "sampler", None)
    if sampler is None or isinstance(sampler, SequentialSampler):
        return loader
    kind = type(sampler).__name__
    if not rebuildable(loader):
        raise TaskError(
            f"overfit_batches needs the {phase} loader's samples in order, but its {kind} cannot be replaced "
            "(the DataLoader cannot be rebuilt); pass a DataLoader with shuffle=False."
        )
    warnings.warn(
        f"overfit_batches was requested but the {phase} loader draws its samples with a {kind}: it now reads "
        "them in order (a SequentialSampler), so every epoch sees the same batches.",
        UserWarning,
        stacklevel=2,
    )
    return rebuild(loader, sampler=SequentialSampler(loader.dataset))
