"""trainer/loop/feeds.py: each way of reading an epoch's batches yields (batch_idx, batch, hook_idx, last) as the
loop before it read them (07a338b's train_epoch): the same batches, the same `last`, the iterator read ahead by
as much as before and never asked again once exhausted; and the pipelined join ends every rank's epoch after the
shortest rank's last batch."""

from __future__ import annotations

from collections import deque
from typing import Any

import pytest

from strategies.agreement import LAG
from trainer.loop.feeds import feed


class _Counted:
    """An iterator over `n` items that records each next() call (and refuses one after it is exhausted)."""

    def __init__(self, n: int) -> None:
        self.n, self.calls, self.ended = n, 0, False

    def __iter__(self) -> _Counted:
        return self

    def __next__(self) -> int:
        assert not self.ended, "an exhausted iterator was asked again"
        self.calls += 1
        if self.calls > self.n:
            self.ended = True
            raise StopIteration
        return self.calls - 1


def _read(it: Any, n: float, start: int, map_style: bool, joins: Any = None) -> list[tuple[int, int, bool]]:
    got = []
    for batch_idx, batch, hook_idx, last in feed(it, n, start, lambda b: b * 10, map_style, joins):
        assert hook_idx == batch_idx
        got.append((batch_idx, batch, last))
    return got


@pytest.mark.parametrize("map_style", [True, False], ids=["at-step", "ahead"])
@pytest.mark.parametrize(
    ("items", "n", "start"), [(5, 5, 0), (5, 5, 2), (3, 5, 0), (1, 1, 0), (0, 3, 0), (4, 4, 4)]
)
def test_known_length_feeds(map_style, items, n, start):
    it = _Counted(items)
    got = _read(it, n, start, map_style)
    count = min(items, n - start)
    assert got == [(start + i, i * 10, start + i == n - 1) for i in range(count)]
    if (
        map_style
    ):  # read at its step: no batch read beyond the ones stepped on (+ the end, when it comes first)
        assert it.calls == count + (items < n - start)
    else:  # one ahead, as Lightning's fetcher: the end is seen at the last batch, not asked again after it
        assert it.calls == min(items + 1, n - start)


@pytest.mark.parametrize("items", [0, 1, 4])
def test_unknown_length_reads_one_ahead_and_marks_the_last(items):
    it = _Counted(items)
    assert _read(it, float("inf"), 0, False) == [(i, i * 10, i == items - 1) for i in range(items)]
    assert it.calls == items + 1


class _TwoRanks:
    """A stand-in for strategies.agreement.Pipelined between this rank and another whose iterator has `other`
    batches (its reads run in lockstep with ours): MAX of the two "out of data" flags, answered `lag` posts late."""

    lag = LAG

    def __init__(self, other: int) -> None:
        self.other, self.posted, self.pending, self.taken = other, 0, deque(), 0

    def post(self, flag: int) -> None:
        self.pending.append(max(flag, int(self.posted >= self.other)))
        self.posted += 1

    def take(self) -> int:
        assert len(self.pending) > self.lag or self.taken == 0, "an answer read before `lag` more posts"
        self.taken += 1
        return self.pending.popleft()

    def drain(self) -> list[int]:
        out = list(self.pending)
        self.pending.clear()
        return out


@pytest.mark.parametrize(("mine", "other"), [(10, 7), (7, 10), (5, 5), (0, 3), (3, 0), (1, 9)])
def test_the_joined_feed_ends_with_the_shortest_rank(mine, other):
    it, joins = _Counted(mine), _TwoRanks(other)
    shortest = min(mine, other)
    assert _read(it, float("inf"), 0, False, joins) == [
        (i, i * 10, i == shortest - 1) for i in range(shortest)
    ]
    assert not joins.pending  # every agreement posted was collected before the epoch's end
    assert joins.posted == LAG + 1 + shortest  # in lockstep: the same count on every rank
