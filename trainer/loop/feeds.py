"""The training epoch's batches as the loop reads them: `(batch_idx, batch, hook_idx, last)` for each batch to
step on, the batch already on the device. One generator per way of reading, picked once per epoch (`feed`):

- a map-style loader of known length is read at its step (the end is known without reading, and random draws
  in the data set keep their order for a bit-identical resume);
- any other loader of known length is read one batch ahead, as Lightning's fetcher, so that an iterable that
  changes state when it runs out is seen at the same step;
- an unknown length (an IterableDataset) is read one ahead too, and its last batch is the one after which the
  data ends; under several processes the ranks agree on that without the host waiting for the device (`_joined`);
- a `dataloader_iter` step reads the batches itself (trainer/loop/loader_iter.py): the hooks see the batch it
  fetched last.
`epoch_iterator` opens the loader for the epoch (skipping what a resumed run consumed already).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from itertools import islice
from typing import TYPE_CHECKING, Any

import torch

from strategies.data.reinit import rebuild, rebuildable
from trainer.loop.combined import epoch_iterator as combined_epoch
from trainer.loop.data import SkipBatchSampler
from trainer.loop.loader_iter import LoaderIter
from trainer.seed import get_rng_state, set_rng_state
from trainer.utilities.combined_loader import CombinedLoader

if TYPE_CHECKING:
    from trainer.trainer import Trainer

_END = object()  # the loader's iterator is exhausted
Feed = Iterator[tuple[int, Any, int, bool]]


def feed(
    batches: Iterator[Any],
    n: int | float,
    start: int,
    move: Callable[[Any], Any],
    map_style: bool,
    joins: Any = None,
    loader_iter: LoaderIter | None = None,
) -> Feed:
    """This epoch's batches from `start` (of `n`, `inf` when unknown), each moved by `move`. `joins`: the
    strategy's agreement on the end of data (strategies/comm.py, `joins`) when ranks must agree on it."""
    if loader_iter is not None:
        return _stepped(loader_iter, n, start)
    if n == float("inf"):
        return _unknown(batches, start, move) if joins is None else _joined(batches, start, move, joins)
    if map_style:
        return _at_step(batches, int(n), start, move)
    return _ahead(batches, int(n), start, move)


def _at_step(batches: Iterator[Any], n: int, start: int, move: Callable[[Any], Any]) -> Feed:
    final, batch_idx = n - 1, start - 1
    for batch_idx, batch in zip(range(start, final), batches):  # (the range first: not read past the end)
        yield batch_idx, move(batch), batch_idx, False
    if batch_idx + 1 == final:  # (not when the data ran out first: an exhausted iterator is not asked again)
        batch = next(batches, _END)
        if batch is not _END:
            yield final, move(batch), final, True


def _ahead(batches: Iterator[Any], n: int, start: int, move: Callable[[Any], Any]) -> Feed:
    final = n - 1
    nxt = next(batches, _END) if start <= final else _END
    for batch_idx in range(start, final):
        if nxt is _END:
            return
        batch, nxt = nxt, next(batches, _END)
        yield batch_idx, move(batch), batch_idx, False
    if nxt is not _END and start <= final:  # the last batch: the iterator is not asked again
        yield final, move(nxt), final, True


def _unknown(batches: Iterator[Any], start: int, move: Callable[[Any], Any]) -> Feed:
    nxt, batch_idx = next(batches, _END), start
    while nxt is not _END:
        batch, nxt = nxt, next(batches, _END)
        yield batch_idx, move(batch), batch_idx, nxt is _END
        batch_idx += 1


def _joined(batches: Iterator[Any], start: int, move: Callable[[Any], Any], joins: Any) -> Feed:
    """Every rank steps on as many batches as the rank with the fewest. Each batch read posts this rank's
    "out of data" to `joins` (a pipelined MAX agreement, strategies/agreement.py), and the reads run
    `joins.lag + 1` batches ahead of the step, so a batch's answer is read `lag` batches after it was posted:
    the loop never waits for it. A batch is the last when the answer for the batch after it says some rank
    has none. Every rank posts and reads at the same points, so all end at the same batch."""
    ahead: deque[Any] = deque()
    ended = False  # this rank's iterator ran out: it is not asked again, and posts "out of data"

    def read() -> None:
        nonlocal ended
        batch = _END if ended else next(batches, _END)
        ended = batch is _END
        ahead.append(batch)
        joins.post(int(ended))

    try:
        for _ in range(joins.lag + 1):
            read()
        if joins.take():  # some rank has no first batch
            return
        batch_idx = start
        while True:
            read()
            last = joins.take() != 0  # the answer for the batch after this one
            yield batch_idx, move(ahead.popleft()), batch_idx, last
            if last:
                return
            batch_idx += 1
    finally:
        joins.drain()  # the answers posted past the end (or past a stop), on every rank alike


def _stepped(loader_iter: LoaderIter, n: int | float, start: int) -> Feed:
    """A step per turn while the iterator has data; the hooks get the batch it fetched last (None at first)."""
    batch_idx = start
    while not loader_iter.done and batch_idx < n:
        yield batch_idx, loader_iter.batch, loader_iter.batch_idx, batch_idx + 1 == n
        batch_idx += 1


def epoch_iterator(t: Trainer) -> tuple[Any, int]:
    """Iterator over this epoch's batches and the index of its first batch (non-zero when resuming).

    Resuming mid-epoch replays the epoch's random draws from the RNG state saved at its start, then skips
    the consumed batches in the batch sampler (indices only, no data is read), then restores the RNG
    state of the moment the checkpoint was taken; the rest of the epoch is identical to an uninterrupted run.
    """
    state, loader = t.state, t.loaders["train"][0]
    skip = state.batch_in_epoch
    resuming = bool(skip and state.resume_rng is not None and state.epoch_start_rng is not None)
    if not resuming:
        state.epoch_start_rng = get_rng_state()
    if isinstance(loader, CombinedLoader):  # each inner loader replays and skips its part (loop/combined.py)
        it = combined_epoch(loader, state, skip if resuming else 0)
    elif not resuming:
        state.combined = None
        return iter(loader), 0
    elif rebuildable(loader) and loader.batch_sampler is not None:
        set_rng_state(state.epoch_start_rng)  # type: ignore[arg-type]
        sampler = SkipBatchSampler(loader.batch_sampler, skip)
        it = iter(rebuild(loader, batch_sampler=sampler))
        sampler.prime()
    else:  # iterable data sets cannot skip by index: read and drop the consumed batches
        set_rng_state(state.epoch_start_rng)  # type: ignore[arg-type]
        it = iter(loader)
        for _ in islice(it, skip):
            pass
    if not resuming:
        return it, 0
    set_rng_state(state.resume_rng)
    state.resume_rng = None
    return it, skip


def map_style(loader: Any) -> bool:
    """A DataLoader over an indexable data set (its batches come from a batch sampler); for a CombinedLoader,
    each of its loaders."""
    if isinstance(loader, CombinedLoader):
        return all(map_style(inner) for inner in loader.flattened)
    return getattr(loader, "batch_sampler", None) is not None and not isinstance(
        getattr(loader, "dataset", None), torch.utils.data.IterableDataset
    )
