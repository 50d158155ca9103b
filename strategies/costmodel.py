"""Alpha-beta cost model of bucketed all-reduce overlapped with backward, and the bucket layout it prefers.

A ring all-reduce of n bytes over p ranks costs T(n, p) = 2(p-1) alpha + 2(p-1)/p n beta: alpha is the
latency of one message, beta the seconds per byte of the link. Buckets are all-reduced one after another
on one channel, each as soon as its last gradient is ready, so a step takes

    forward + max(backward, end of the last all-reduce) + optimizer step

and the communication left after backward ("exposed") is what bucketing tries to hide. Small buckets
start early but each pays alpha; one big bucket pays alpha once but starts only when backward ends.

    cost = LinkCost(alpha=1e-4, beta=8e-9)             # 100 us latency, 1 Gbit/s
    buckets = best_buckets(ready_s, sizes, order, cost, world_size=8)
    predict(ready_s, sizes, buckets, cost, world_size=8).step_s
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from strategies.buckets import assign_buckets

_MB = 1024 * 1024


@dataclass(frozen=True)
class LinkCost:
    """alpha: seconds of latency per message; beta: seconds per byte."""

    alpha: float
    beta: float

    def allreduce_s(self, nbytes: float, world_size: int) -> float:
        """Seconds of a ring all-reduce of `nbytes` over `world_size` ranks (0 for a single rank)."""
        p = world_size
        if p <= 1:
            return 0.0
        return 2 * (p - 1) * self.alpha + 2 * (p - 1) / p * nbytes * self.beta

    @classmethod
    def fit(cls, small: tuple[float, float], large: tuple[float, float], world_size: int) -> LinkCost:
        """The alpha and beta through two measured (bytes, seconds) all-reduce probes (alpha clamped at 0).

        If the large probe was not slower than the small one (noise larger than the transfer: a fast
        link on a busy machine), all of the large probe's time is taken as transfer time."""
        (n1, t1), (n2, t2) = small, large
        p = max(world_size, 2)
        per_byte = (t2 - t1) / (n2 - n1) if t2 > t1 else t2 / n2  # = 2(p-1)/p beta
        beta = per_byte * p / (2 * (p - 1))
        alpha = max((t1 - per_byte * n1) / (2 * (p - 1)), 0.0)
        return cls(alpha, beta)


@dataclass
class Prediction:
    """Predicted timings of one step, in seconds."""

    step_s: float  # forward + max(backward, last all-reduce) + optimizer step
    backward_s: float  # when the last gradient is ready
    comm_end_s: float  # when the last all-reduce ends, from the start of backward
    exposed_s: float  # communication after backward: max(0, comm_end - backward)
    comm_s: float  # total all-reduce time, hidden or not


def predict(
    ready_s: Sequence[float],
    sizes: Sequence[int],
    buckets: Sequence[Sequence[int]],
    cost: LinkCost,
    world_size: int,
    forward_s: float = 0.0,
    step_s: float = 0.0,
    backward_s: float | None = None,
) -> Prediction:
    """Step time with `buckets` (parameter indices, launch order) launched when ready, one at a time.

    ready_s[i]: when parameter i's gradient is ready (seconds since backward started); sizes[i]: its bytes.
    """
    backward = max(ready_s) if backward_s is None else backward_s
    end, total = 0.0, 0.0
    for bucket in buckets:
        t = cost.allreduce_s(sum(sizes[i] for i in bucket), world_size)
        # in launch order: a bucket waits for its gradients and for the one before it (one channel)
        end = max(end, max(ready_s[i] for i in bucket)) + t
        total += t
    exposed = max(0.0, end - backward)
    return Prediction(forward_s + backward + exposed + step_s, backward, end, exposed, total)


def _best_segments(ready: list[float], size: list[int], cost: LinkCost, world_size: int) -> list[int]:
    """Split a sequence (gradients in ready order, `ready` non-decreasing) into contiguous buckets so that
    the last all-reduce ends earliest; returns each bucket's start index. Exact: a bucket's end only grows
    with the previous bucket's end, so the best split of a prefix is part of the best split of the whole."""
    n = len(ready)
    prefix = [0]
    for s in size:
        prefix.append(prefix[-1] + s)
    # finish[j]: earliest end of the all-reduces of the first j gradients; cut[j]: start of the last bucket
    finish, cut = [0.0] + [float("inf")] * n, [0] * (n + 1)
    for j in range(1, n + 1):
        for i in range(j):
            t = max(finish[i], ready[j - 1]) + cost.allreduce_s(prefix[j] - prefix[i], world_size)
            if t < finish[j] * (1 - 1e-9):  # on a near-tie keep the earlier cut: fewer, larger buckets
                finish[j], cut[j] = t, i
    starts, j = [], n
    while j > 0:
        starts.append(cut[j])
        j = cut[j]
    return starts[::-1]


def _atoms(sizes: list[int], limit: int) -> list[int]:
    """Start indices of at most ~`limit` runs of consecutive parameters (keeps the O(n^2) search small)."""
    if len(sizes) <= limit:
        return list(range(len(sizes)))
    target = sum(sizes) / limit
    starts, filled = [0], 0
    for k, s in enumerate(sizes):
        if filled >= target:
            starts.append(k)
            filled = 0
        filled += s
    return starts


def best_buckets(
    ready_s: Sequence[float],
    sizes: Sequence[int],
    order: Sequence[int],
    cost: LinkCost,
    world_size: int,
    keys: Sequence[object] | None = None,
    max_units: int = 400,
) -> list[list[int]]:
    """Contiguous buckets along `order` (the gradient-ready order) minimising the predicted exposed
    communication; parameters of different `keys` (device, dtype) never share a bucket. Launch order
    follows `order`, as assign_buckets' does. Boundaries fall between runs of consecutive parameters,
    at most about `max_units` runs per key (every parameter its own run on models up to that size)."""
    keys = list(keys) if keys is not None else [None] * len(sizes)
    by_key: dict[object, list[int]] = {}
    for i in order:
        by_key.setdefault(keys[i], []).append(i)
    chosen: list[list[int]] = []
    for members in by_key.values():
        # gradients are ready in `order`; a running max keeps the times monotone if the clock was noisy
        ready, latest = [], 0.0
        for i in members:
            latest = max(latest, ready_s[i])
            ready.append(latest)
        # runs of consecutive parameters are the units: a bucket boundary falls between two runs
        atoms = _atoms([sizes[i] for i in members], max_units)
        ends = [*atoms[1:], len(members)]
        unit_ready = [ready[e - 1] for e in ends]
        unit_size = [sum(sizes[i] for i in members[a:e]) for a, e in zip(atoms, ends)]
        starts = [atoms[k] for k in _best_segments(unit_ready, unit_size, cost, world_size)]
        for a, b in zip(starts, [*starts[1:], len(members)]):
            chosen.append(members[a:b])
    position = {i: k for k, i in enumerate(order)}
    return sorted(chosen, key=lambda bucket: position[bucket[0]])


def choose_buckets(
    ready_s: Sequence[float],
    sizes: Sequence[int],
    order: Sequence[int],
    cost: LinkCost,
    world_size: int,
    keys: Sequence[object] | None,
    current: list[list[int]],
    outside_s: float = 0.0,
    min_gain: float = 0.0,
) -> list[list[int]]:
    """best_buckets if it predicts a step at least `min_gain` (a fraction) faster than `current`, else
    `current`: acting on a predicted gain smaller than the model's error is a coin toss."""
    best = best_buckets(ready_s, sizes, order, cost, world_size, keys)
    new = predict(ready_s, sizes, best, cost, world_size, outside_s).step_s
    old = predict(ready_s, sizes, current, cost, world_size, outside_s).step_s
    return best if new <= (1 - min_gain) * old else current


def buckets_for_cap(
    sizes: Sequence[int], order: Sequence[int], cap_mb: float, first_cap_mb: float = 1.0
) -> list[list[int]]:
    """The buckets a fixed cap gives (the Reducer's rule: first bucket <= first_cap_mb, then cap_mb)."""
    cap = int(cap_mb * _MB)
    return assign_buckets(
        list(sizes), [None] * len(sizes), list(order), min(int(first_cap_mb * _MB), cap), cap
    )


def sweep_caps(
    ready_s: Sequence[float],
    sizes: Sequence[int],
    order: Sequence[int],
    cost: LinkCost,
    world_size: int,
    caps_mb: Sequence[float],
    forward_s: float = 0.0,
    step_s: float = 0.0,
) -> list[tuple[float, Prediction]]:
    """Predicted step time for each fixed bucket cap (in MB, first bucket capped like the Reducer's)."""
    out = []
    for cap in caps_mb:
        buckets = buckets_for_cap(sizes, order, cap, first_cap_mb=min(1.0, cap))
        out.append((cap, predict(ready_s, sizes, buckets, cost, world_size, forward_s, step_s)))
    return out


def sweep_world(
    ready_s: Sequence[float],
    sizes: Sequence[int],
    buckets: Sequence[Sequence[int]] | None,
    cost: LinkCost,
    world_sizes: Sequence[int],
    forward_s: float = 0.0,
    step_s: float = 0.0,
    order: Sequence[int] | None = None,
) -> list[tuple[int, Prediction]]:
    """Predicted step time for each world size; buckets=None re-picks the best buckets at each size."""
    out = []
    order = list(order) if order is not None else list(reversed(range(len(sizes))))
    for p in world_sizes:
        chosen = buckets if buckets is not None else best_buckets(ready_s, sizes, order, cost, p)
        out.append((p, predict(ready_s, sizes, chosen, cost, p, forward_s, step_s)))
    return out
