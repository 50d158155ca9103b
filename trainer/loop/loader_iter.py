"""The `dataloader_iter` step flavor (Lightning's): a step method that declares a parameter named
`dataloader_iter` receives an iterator instead of a batch and reads the batches itself, as many as it wants,
with ``batch, batch_idx, dataloader_idx = next(dataloader_iter)``.

The loop then knows a batch only after the step fetched it, so (as in Lightning) the batch hooks see the batch
most recently fetched: ``on_*_batch_start`` the previous step's last one (None, index 0 before the first fetch),
``on_*_batch_end`` the step's own last one. Batches are not moved to the device (the step does it), the
limit_*_batches caps what the iterator yields, and the epoch (or evaluation pass) ends when the iterator is
exhausted: after the step that read the last batch, or when a step lets StopIteration escape."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from typing import Any

from tandem_core.errors import ConfigError


def takes_loader_iter(fn: Any) -> bool:
    """True when the step `fn` names a positional parameter `dataloader_iter` (a `*args` does not count)."""
    if not callable(fn):
        return False
    try:
        params = inspect.signature(fn).parameters  # follows functools.wraps' __wrapped__
    except (TypeError, ValueError):
        return False
    p = params.get("dataloader_iter")
    return p is not None and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)


class LoaderIter(Iterator[tuple[Any, int, int]]):
    """What a `dataloader_iter` step receives: yields ``(batch, batch_idx, dataloader_idx)``; `fetched` counts the
    batches read so far, `done` says the data (or its limit, `length`) is exhausted. The loop reads `batch`,
    `batch_idx` and `dataloader_idx` (the last fetched) for the batch hooks."""

    def __init__(self, source: Iterator[tuple[Any, int, int]], length: int | float | None) -> None:
        self._source = source
        self.length = None if length is None or length == float("inf") else int(length)
        self.fetched = 0
        self.done = self.length == 0
        self.batch: Any = None
        self.batch_idx = 0
        self.dataloader_idx = 0

    def __iter__(self) -> LoaderIter:
        return self

    def __next__(self) -> tuple[Any, int, int]:
        if self.done:
            raise StopIteration
        try:
            item = next(self._source)
        except StopIteration:
            self.done = True
            raise
        self.fetched += 1
        if self.length is not None:
            self.done = self.fetched >= self.length
        self.batch, self.batch_idx, self.dataloader_idx = item
        return item


def training_feed(batches: Iterable[Any], n: int | float, start: int) -> LoaderIter:
    """The training epoch's iterator: the training loader's batches (a combined loader's already merged), indexed
    from `start`, at most `n` of them."""
    known = n != float("inf")
    source = ((b, i, 0) for i, b in enumerate(islice(batches, int(n) - start if known else None), start))
    return LoaderIter(source, n - start if known else None)


def eval_feed(
    loaders: list[Any], counts: list[int | float], open_: Callable[[Any], Iterable[Any]]
) -> LoaderIter:
    """An evaluation pass's iterator: each loader's batches in turn (`open_(loader)`, at most its count), indexed
    per loader, with the loader's index as dataloader_idx; its length is the sum when every count is known."""

    def source() -> Iterator[tuple[Any, int, int]]:
        for dl_idx, (loader, n) in enumerate(zip(loaders, counts)):
            if n == 0:
                continue
            for i, b in enumerate(islice(open_(loader), None if n == float("inf") else int(n))):
                yield b, i, dl_idx

    return LoaderIter(source(), sum(counts))


def check_world_size(t: Any, n: int | float, step: str) -> None:
    """Several processes need a known epoch length here: each rank's step reads its own batches, so a rank whose
    data ran out first would leave the others waiting in a collective."""
    if n == float("inf") and t.world_size > 1:
        raise ConfigError(
            f"{step}(dataloader_iter) with a loader of unknown length under {t.world_size} processes: the ranks "
            "cannot agree where the data ends. Give the loader a length (a map-style data set, or __len__), or "
            f"set limit_{'train' if step == 'training_step' else 'val'}_batches to an int."
        )
