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

On a CPU the two are not independent: an all-reduce needs the rank's CPU for its per-message work and, on a
fast link, for copying and summing, and backward holds that CPU. `LinkCost.cpu_alpha/cpu_beta` say how
much of an all-reduce's time is such CPU work (it does not progress while backward runs; the rest, the
wire, does) and `compute_rate` how fast backward runs while an all-reduce is in flight (1: unaffected).
`predict` then simulates both on one timeline. With the defaults (no CPU share, rate 1) it is the formula
above. The Reducer measures all five numbers (strategies/autotune.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from strategies.buckets import assign_buckets

_MB = 1024 * 1024


@dataclass(frozen=True)
class LinkCost:
    """alpha: seconds of latency per message; beta: seconds per byte. cpu_alpha, cpu_beta: the part of
    each that is this rank's CPU work, which waits while backward runs; compute_rate: backward's speed
    while an all-reduce is in flight."""

    alpha: float
    beta: float
    cpu_alpha: float = 0.0
    cpu_beta: float = 0.0
    compute_rate: float = 1.0

    def allreduce_s(self, nbytes: float, world_size: int) -> float:
        """Seconds of a ring all-reduce of `nbytes` over `world_size` ranks (0 for a single rank)."""
        return _ring(self.alpha, self.beta, nbytes, world_size)

    def cpu_s(self, nbytes: float, world_size: int) -> float:
        """Seconds of that all-reduce which need the rank's CPU (at most the whole all-reduce)."""
        cpu = _ring(self.cpu_alpha, self.cpu_beta, nbytes, world_size)
        return min(cpu, self.allreduce_s(nbytes, world_size))

    @classmethod
    def fit(cls, small: tuple[float, float], large: tuple[float, float], world_size: int) -> LinkCost:
        """The alpha and beta through two measured (bytes, seconds) all-reduce probes (alpha clamped at 0).

        If the large probe was not slower than the small one (noise larger than the transfer: a fast
        link on a busy machine), all of the large probe's time is taken as transfer time."""
        return cls(*_fit_ring(small, large, world_size))

    def with_cpu(
        self, small: tuple[float, float], large: tuple[float, float], world_size: int, compute_rate: float
    ) -> LinkCost:
        """This link plus the CPU share fitted through two (bytes, CPU seconds) points and backward's rate.
        A large probe with less CPU time than the small one (its transfer hid it) gives cpu_beta 0."""
        (_, c1), (_, c2) = small, large
        if c2 <= c1:
            cpu_alpha, cpu_beta = c1 / (2 * (max(world_size, 2) - 1)), 0.0
        else:
            cpu_alpha, cpu_beta = _fit_ring(small, large, world_size)
        rate = min(max(compute_rate, 0.05), 1.0)
        return LinkCost(self.alpha, self.beta, cpu_alpha, cpu_beta, rate)


def _ring(alpha: float, beta: float, nbytes: float, world_size: int) -> float:
    p = world_size
    if p <= 1:
        return 0.0
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * nbytes * beta


def _fit_ring(small: tuple[float, float], large: tuple[float, float], world_size: int) -> tuple[float, float]:
    (n1, t1), (n2, t2) = small, large
    p = max(world_size, 2)
    per_byte = (t2 - t1) / (n2 - n1) if t2 > t1 else t2 / n2  # = 2(p-1)/p beta
    beta = per_byte * p / (2 * (p - 1))
    alpha = max((t1 - per_byte * n1) / (2 * (p - 1)), 0.0)
    return alpha, beta


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

    ready_s[i]: when parameter i's gradient is ready (seconds of backward alone since it started);
    sizes[i]: its bytes. While an all-reduce and backward run together, backward runs at
    cost.compute_rate and the all-reduce only at the share of it that is not CPU work (cost.cpu_s).
    """
    work = max(ready_s) if backward_s is None else backward_s
    ready, comm, latest = [], [], 0.0
    for bucket in buckets:  # in launch order: a bucket also waits for the one before it (one channel)
        latest = max(latest, max(ready_s[i] for i in bucket))
        nbytes = sum(sizes[i] for i in bucket)
        t = cost.allreduce_s(nbytes, world_size)
        ready.append(latest)
        comm.append((t, 1.0 - cost.cpu_s(nbytes, world_size) / t if t > 0 else 1.0))
    backward_end, comm_end = _simulate(work, ready, comm, cost.compute_rate)
    exposed = max(0.0, comm_end - backward_end)
    return Prediction(
        forward_s + backward_end + exposed + step_s, backward_end, comm_end, exposed, sum(t for t, _ in comm)
    )


def _simulate(
    work: float, ready: list[float], comm: list[tuple[float, float]], rate: float
) -> tuple[float, float]:
    """Wall-clock ends of backward (`work` seconds alone) and of the all-reduces; comm[k] = (seconds alone,
    speed while backward runs), launched in order once backward has done ready[k] seconds of its work."""
    ready = [min(r, work) for r in ready]
    t, done, k, left = 0.0, 0.0, 0, comm[0][0] if comm else 0.0
    backward_end: float | None = None
    while k < len(comm):
        running = done >= ready[k]  # bucket k is in flight (its gradients are ready, the previous ended)
        computing = done < work
        if running and not computing:  # backward is over: the rest of the all-reduces run alone
            t += left + sum(c for c, _ in comm[k + 1 :])
            break
        speed = comm[k][1] if computing else 1.0
        b_rate = rate if running else 1.0
        target = work if running else ready[k]  # backward's next event: the end, or bucket k's gradients
        dt_b = (target - done) / b_rate
        dt_c = left / speed if running and speed > 0 else float("inf")
        dt = min(dt_b, dt_c)
        t += dt
        done = min(target, done + dt * b_rate) if dt < dt_b else target
        if done >= work and backward_end is None:
            backward_end = t
        if running and dt_c <= dt_b:
            k += 1
            left = comm[k][0] if k < len(comm) else 0.0
        elif running:
            left -= dt * speed
    if backward_end is None:  # every all-reduce ended before backward did (or there were none)
        backward_end = t + (work - done) if done < work else t
    return backward_end, t


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


def best_layout(
    ready_s: Sequence[float],
    sizes: Sequence[int],
    order: Sequence[int],
    cost: LinkCost,
    world_size: int,
    keys: Sequence[object] | None = None,
    outside_s: float = 0.0,
) -> list[list[int]]:
    """The layout with the fastest predicted step among best_buckets (exact for the link alone, and again
    with latency weighted 3-100x, which merges buckets) and fixed caps of 0.25-64 MB. With a CPU share the
    exact search no longer applies (an early bucket can slow backward), so the full model scores these."""
    keys = list(keys) if keys is not None else [None] * len(sizes)
    candidates = [
        best_buckets(ready_s, sizes, order, LinkCost(cost.alpha * w, cost.beta), world_size, keys)
        for w in (1, 3, 10, 30, 100)
    ]
    candidates += [
        assign_buckets(list(sizes), keys, list(order), int(cap * _MB), int(cap * _MB))
        for cap in (0.25, 1, 4, 16, 64)
    ]
    scored = [
        (predict(ready_s, sizes, c, cost, world_size, outside_s).step_s, k) for k, c in enumerate(candidates)
    ]
    return candidates[min(scored)[1]]  # on a tie the first: the exact search, then fewer buckets


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
    """best_layout if it predicts a step at least `min_gain` (a fraction) faster than `current`, else
    `current`: acting on a predicted gain smaller than the model's error is a coin toss."""
    best = best_layout(ready_s, sizes, order, cost, world_size, keys, outside_s)
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
    """Predicted step time for each world size; buckets=None re-picks the best layout at each size."""
    out = []
    order = list(order) if order is not None else list(reversed(range(len(sizes))))
    for p in world_sizes:
        chosen = (
            buckets if buckets is not None else best_layout(ready_s, sizes, order, cost, p, None, forward_s)
        )
        out.append((p, predict(ready_s, sizes, chosen, cost, p, forward_s, step_s)))
    return out
