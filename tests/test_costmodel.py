"""The alpha-beta cost model (strategies/costmodel.py) on cases whose answer is known analytically."""

from __future__ import annotations

import itertools
import random

import pytest

from strategies.costmodel import (
    LinkCost,
    best_buckets,
    best_layout,
    buckets_for_cap,
    choose_buckets,
    predict,
    sweep_caps,
    sweep_world,
)

MB = 1024 * 1024


def _model(n: int = 12, seed: int = 0) -> tuple[list[float], list[int], list[int]]:
    """Gradients ready one after another in reverse parameter order, sizes 0.1-2 MB."""
    rnd = random.Random(seed)
    sizes = [int(rnd.uniform(0.1, 2.0) * MB) for _ in range(n)]
    order = list(reversed(range(n)))
    ready = [0.0] * n
    t = 0.0
    for i in order:
        t += rnd.uniform(1e-3, 5e-3)
        ready[i] = t
    return ready, sizes, order


def test_ring_allreduce_formula() -> None:
    cost = LinkCost(alpha=1e-4, beta=1e-8)
    for p in (2, 3, 8, 256):
        assert cost.allreduce_s(MB, p) == pytest.approx(2 * (p - 1) * 1e-4 + 2 * (p - 1) / p * MB * 1e-8)
    assert cost.allreduce_s(MB, 1) == 0.0
    fitted = LinkCost.fit((4096, cost.allreduce_s(4096, 4)), (4 * MB, cost.allreduce_s(4 * MB, 4)), 4)
    assert fitted.alpha == pytest.approx(cost.alpha) and fitted.beta == pytest.approx(cost.beta)
    noisy = LinkCost.fit((4096, 2e-3), (4 * MB, 1e-3), 2)  # the small probe hit a busy moment
    assert noisy.beta == pytest.approx(1e-3 / (4 * MB)) and noisy.alpha >= 0


def test_one_bucket_is_the_flat_allreduce_after_backward() -> None:
    ready, sizes, order = _model()
    cost = LinkCost(2e-4, 1e-8)
    one = predict(ready, sizes, [order], cost, 4, forward_s=0.01, step_s=0.002)
    flat = cost.allreduce_s(sum(sizes), 4)
    assert one.step_s == pytest.approx(0.01 + max(ready) + flat + 0.002)
    assert one.exposed_s == pytest.approx(flat) and one.comm_s == pytest.approx(flat)
    # a cap larger than the model is the same single bucket (after the 1 MB first bucket: capped at the model)
    assert buckets_for_cap(sizes, order, 1e6, first_cap_mb=1e6) == [order]


def test_infinite_bandwidth_and_no_latency_is_compute_bound() -> None:
    ready, sizes, order = _model()
    free = LinkCost(0.0, 0.0)
    for buckets in ([order], [[i] for i in order], best_buckets(ready, sizes, order, free, 8)):
        pred = predict(ready, sizes, buckets, free, 8, forward_s=0.01, step_s=0.002)
        assert pred.step_s == pytest.approx(0.01 + max(ready) + 0.002) and pred.exposed_s == 0.0


def test_monotonic_in_world_size() -> None:
    ready, sizes, order = _model()
    cost = LinkCost(5e-5, 4e-9)
    for buckets in ([order], buckets_for_cap(sizes, order, 2.0), None):
        steps = [pred.step_s for _, pred in sweep_world(ready, sizes, buckets, cost, [2, 4, 8, 16, 64, 256])]
        assert steps == sorted(steps) and steps[0] < steps[-1]


def test_best_buckets_is_optimal_among_all_contiguous_splits() -> None:
    ready, sizes, order = _model(n=9, seed=3)
    for cost in (LinkCost(1e-3, 1e-9), LinkCost(1e-5, 8e-9), LinkCost(2e-4, 2e-9)):
        chosen = best_buckets(ready, sizes, order, cost, 4)
        assert [i for b in chosen for i in b] == order  # contiguous, in ready order, every parameter once
        best = predict(ready, sizes, chosen, cost, 4).step_s
        for cuts in itertools.product([False, True], repeat=len(order) - 1):  # every split: 256 layouts
            buckets, current = [], [order[0]]
            for cut, i in zip(cuts, order[1:]):
                if cut:
                    buckets.append(current)
                    current = []
                current.append(i)
            buckets.append(current)
            assert best <= predict(ready, sizes, buckets, cost, 4).step_s + 1e-12


def test_latency_bound_link_merges_bandwidth_bound_link_splits() -> None:
    ready, sizes, order = _model()
    assert len(best_buckets(ready, sizes, order, LinkCost(1.0, 1e-12), 2)) == 1  # each message costs 2 s
    assert len(best_buckets(ready, sizes, order, LinkCost(1e-6, 1e-9), 2)) > 3  # 1 ms per MB, 1 us each


def test_keys_never_share_a_bucket_and_large_models_stay_fast() -> None:
    ready, sizes, order = _model(n=3000, seed=1)
    keys = ["f32" if i % 7 else "f64" for i in range(3000)]
    chosen = best_buckets(ready, sizes, order, LinkCost(1e-4, 1e-9), 8, keys)
    assert sorted(i for b in chosen for i in b) == list(range(3000))
    assert all(len({keys[i] for i in b}) == 1 for b in chosen)


def test_sweep_caps_has_the_overlap_optimum_inside() -> None:
    ready, sizes, order = _model(n=40, seed=2)
    cost = LinkCost(2e-3, 1e-9)  # latency ~ one layer's backward, whole-model comm ~ a third of backward
    steps = dict(
        (cap, pred.step_s) for cap, pred in sweep_caps(ready, sizes, order, cost, 2, [0.01, 5, 1000])
    )
    assert steps[5] < steps[0.01] and steps[5] < steps[1000]
    auto = predict(ready, sizes, best_buckets(ready, sizes, order, cost, 2), cost, 2).step_s
    assert auto <= min(steps.values()) + 1e-12


def test_choose_buckets_keeps_the_current_layout_unless_the_gain_is_large_enough() -> None:
    ready, sizes, order = _model(n=40, seed=2)
    cost, current = LinkCost(2e-3, 1e-9), buckets_for_cap(sizes, order, 1000)
    best = best_buckets(ready, sizes, order, cost, 2)
    gain = 1 - predict(ready, sizes, best, cost, 2).step_s / predict(ready, sizes, current, cost, 2).step_s
    assert gain > 0.05
    assert choose_buckets(ready, sizes, order, cost, 2, None, current, 0.0, gain - 0.01) == best
    assert choose_buckets(ready, sizes, order, cost, 2, None, current, 0.0, gain + 0.01) == current


def _closed_form(
    ready: list[float], sizes: list[int], buckets: list[list[int]], cost: LinkCost, p: int
) -> float:
    """Backward and the all-reduces independent: each bucket starts when ready and after the one before."""
    end = 0.0
    for bucket in buckets:
        end = max(end, max(ready[i] for i in bucket)) + cost.allreduce_s(sum(sizes[i] for i in bucket), p)
    return max(max(ready), end)


def test_without_a_cpu_share_the_simulation_is_the_closed_form() -> None:
    rnd = random.Random(5)
    for seed in range(20):
        ready, sizes, order = _model(n=15, seed=seed)
        cuts = sorted(rnd.sample(range(1, 15), rnd.randint(0, 6)))
        buckets = [order[a:b] for a, b in zip([0, *cuts], [*cuts, 15])]
        cost = LinkCost(rnd.uniform(0, 1e-3), rnd.uniform(0, 1e-8))
        pred = predict(ready, sizes, buckets, cost, 4, forward_s=0.003)
        assert pred.step_s == pytest.approx(0.003 + _closed_form(ready, sizes, buckets, cost, 4))


def test_an_allreduce_that_is_all_cpu_waits_for_backward() -> None:
    ready, sizes, order = _model()
    cost = LinkCost(2e-4, 1e-8, cpu_alpha=2e-4, cpu_beta=1e-8)  # nothing of it progresses next to backward
    for buckets in ([[i] for i in order], buckets_for_cap(sizes, order, 2.0), [order]):
        pred = predict(ready, sizes, buckets, cost, 4)
        total = sum(cost.allreduce_s(sum(sizes[i] for i in b), 4) for b in buckets)
        assert pred.step_s == pytest.approx(max(ready) + total) and pred.comm_s == pytest.approx(total)


def test_backward_slows_down_next_to_an_allreduce() -> None:
    # bucket 0 ready at once, 4 ms of wire; backward (10 ms alone) at half speed meanwhile:
    # 2 ms of its work done by 4 ms, 8 ms left alone: ends at 12 ms, then bucket 1 (4 ms) ends at 16 ms
    cost = LinkCost(alpha=2e-3, beta=0.0, compute_rate=0.5)
    pred = predict([0.0, 0.01], [4, 4], [[0], [1]], cost, 2)
    assert pred.backward_s == pytest.approx(0.012) and pred.comm_end_s == pytest.approx(0.016)
    assert pred.step_s == pytest.approx(0.016) and pred.exposed_s == pytest.approx(0.004)
    # half of each all-reduce is CPU work: bucket 0 moves at half speed next to backward
    half = LinkCost(alpha=2e-3, beta=0.0, cpu_alpha=1e-3)
    pred = predict([0.0, 0.01], [4, 4], [[0], [1]], half, 2)
    assert pred.backward_s == pytest.approx(0.01) and pred.step_s == pytest.approx(0.014)


def test_with_cpu_fits_the_cpu_share_through_two_points() -> None:
    link = LinkCost(1e-4, 1e-8)
    cpu = LinkCost(5e-5, 2e-9)
    points = [(n, cpu.allreduce_s(n, 4)) for n in (4096, 4 * MB)]
    fitted = link.with_cpu(points[0], points[1], 4, compute_rate=0.8)
    assert (fitted.alpha, fitted.beta, fitted.compute_rate) == (1e-4, 1e-8, 0.8)
    assert fitted.cpu_alpha == pytest.approx(5e-5) and fitted.cpu_beta == pytest.approx(2e-9)
    hidden = link.with_cpu((4096, 1.5e-4), (4 * MB, 0.0), 2, compute_rate=2.0)  # the large one's wire hid it
    assert (
        hidden.cpu_beta == 0 and hidden.cpu_s(4096, 2) == pytest.approx(1.5e-4) and hidden.compute_rate == 1.0
    )
    assert hidden.cpu_s(10 * MB, 2) == pytest.approx(1.5e-4)
    assert link.with_cpu((4096, 1.0), (4 * MB, 1.0), 2, 1.0).cpu_s(4096, 2) == link.allreduce_s(
        4096, 2
    )  # capped


def test_best_layout_merges_buckets_when_the_allreduce_needs_the_cpu() -> None:
    ready, sizes, order = _model(n=40, seed=2)
    link = LinkCost(2e-4, 1e-9)
    split = best_buckets(ready, sizes, order, link, 2)
    assert len(split) > 3 and best_layout(ready, sizes, order, link, 2) == split
    cpu_bound = LinkCost(2e-4, 1e-9, cpu_alpha=2e-4, cpu_beta=1e-9)
    merged = best_layout(ready, sizes, order, cpu_bound, 2)
    assert len(merged) < len(split)
    assert (
        predict(ready, sizes, merged, cpu_bound, 2).step_s < predict(ready, sizes, split, cpu_bound, 2).step_s
    )
