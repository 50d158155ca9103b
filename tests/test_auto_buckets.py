"""bucket_cap_mb="auto": measured, decided on rank 0, identical on every rank, tried then kept or undone, grads as torch DDP."""

from __future__ import annotations

import logging
import time

import pytest
import torch
from helpers.reducer_models import assert_grads_close, ddp_step, gathered, make, ours_step
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from strategies.buckets import BucketLayout
from strategies.costmodel import LinkCost, buckets_for_cap, choose_buckets
from strategies.ddp import DDPStrategy
from strategies.reducer import AUTO_ITERATIONS, AUTO_MIN_GAIN, TRIAL_ITERATIONS, Reducer
from tandem_core.errors import ConfigError, DistributedError

STEPS = AUTO_ITERATIONS + TRIAL_ITERATIONS + 1


class Deep(nn.Module):
    """Twelve layers of 256x256 (~3 MB of gradients): several plausible bucket layouts."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(256, 256) for _ in range(12))
        self.head = nn.Linear(256, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return self.head(x)


def _batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(64, 256, generator=g), torch.randint(0, 10, (64,), generator=g)


def _auto_run(rank: int, world_size: int) -> dict:
    torch.set_num_threads(1)
    builds: list[list[list[int]]] = []
    original = BucketLayout.build_groups

    def counting(self: BucketLayout, assignment: list[list[int]]) -> None:
        builds.append([list(b) for b in assignment])
        original(self, assignment)

    BucketLayout.build_groups = counting  # type: ignore[method-assign]
    messages: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())  # type: ignore[method-assign]
    log = logging.getLogger("strategies.reducer")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    ours, theirs = make(Deep), make(Deep)
    reducer = Reducer(ours, bucket_cap_mb="auto")
    ddp = DDP(theirs)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (ours, theirs)]
    out: dict = {"grads": [], "layouts": [], "auto_before": []}
    for step in range(STEPS):
        out["auto_before"].append(reducer.auto is not None)
        out["grads"].append(
            (
                ours_step(ours, reducer, opts[0], *_batch(step, rank)),
                ddp_step(ddp, opts[1], *_batch(step, rank)),
            )
        )
        out["layouts"].append(gathered(reducer.bucket_indices))
    BucketLayout.build_groups = original  # type: ignore[method-assign]
    out["builds"] = builds
    out["auto"] = reducer.auto
    out["sizes"] = [p.numel() * p.element_size() for p in reducer.params]
    out["messages"] = messages
    out["stats_bytes"] = [s.nbytes for s in reducer.stats]
    from strategies.autotune import AutoTuner

    tuner = AutoTuner(None, 0, world_size, 1)  # loopback is fast: a third probe at the gradients' size
    out["probe_sizes"] = [sorted(tuner._probe(torch.device("cpu"), total)[0]) for total in (2**20, 2**24 + 6)]
    try:
        Reducer(make(Deep), bucket_cap_mb="big")  # type: ignore[arg-type]
        out["bad"] = None
    except DistributedError as e:
        out["bad"] = str(e)
    return out


@pytest.fixture(scope="module")
def runs() -> list[dict]:
    from conftest import run_distributed

    return run_distributed(_auto_run, timeout=300.0)


def test_auto_grads_equal_torch_ddp_before_and_after_the_rebuild(runs: list[dict]) -> None:
    for rank, result in enumerate(runs):
        for step, (ours, theirs) in enumerate(result["grads"]):
            assert_grads_close(ours, theirs, what=f"rank {rank} step {step}")


def _expected_layouts(auto, initial: list[list[int]], fixed: list[list[int]]) -> list[list[list[int]]]:
    """The layout in use after each step: 25 MB while measuring; then the chosen buckets and the 25 MB ones
    in turns for TRIAL_ITERATIONS backwards; then the winner (or the 25 MB ones at once, if kept)."""
    out, start = [], AUTO_ITERATIONS - 1  # the plan happens at the end of step AUTO_ITERATIONS - 1
    for s in range(STEPS):
        if s < start:
            out.append(initial)
        elif auto.kept_cap25:
            out.append(fixed)
        elif s < start + TRIAL_ITERATIONS:
            out.append([auto.buckets, fixed][(s - start) % 2])
        else:
            out.append(fixed if auto.reverted else auto.buckets)
    return out


def test_auto_measures_tries_and_decides_the_same_on_every_rank(runs: list[dict]) -> None:
    a0, a1 = runs[0]["auto"], runs[1]["auto"]
    for result in runs:
        # not decided while measuring, decided from the step after AUTO_ITERATIONS backwards on
        assert result["auto_before"] == [s >= AUTO_ITERATIONS for s in range(STEPS)]
        # the initial layout, the 25 MB one in rank 0's order, and the chosen one if it differs (the trial)
        builds = result["builds"]
        assert len(builds) == (2 if a0.kept_cap25 else 3) and (a0.kept_cap25 or builds[2] == a0.buckets)
        layouts = result["layouts"]
        for step in range(STEPS):
            assert layouts[step][0] == layouts[step][1], f"ranks disagree at step {step}"
        assert [layout[0] for layout in layouts] == _expected_layouts(a0, builds[0], builds[1])
    assert (a0.alpha_s, a0.beta_s, a0.buckets, a0.ready_s) == (a1.alpha_s, a1.beta_s, a1.buckets, a1.ready_s)
    assert (a0.cpu_alpha_s, a0.cpu_beta_s, a0.compute_rate) == (
        a1.cpu_alpha_s,
        a1.cpu_beta_s,
        a1.compute_rate,
    )
    assert (a0.sync_s_trial, a0.sync_s_cap25, a0.reverted) == (a1.sync_s_trial, a1.sync_s_cap25, a1.reverted)
    assert (a0.sync_s_trial is None) == (a0.trial_wins is None) == a0.kept_cap25 and a0.sync_s_cap25 > 0
    assert a0.trial_wins == a1.trial_wins


def test_auto_choice_is_the_cost_models_on_rank0_measurements(runs: list[dict]) -> None:
    auto, sizes = runs[0]["auto"], runs[0]["sizes"]
    assert auto.alpha_s >= 0 and auto.beta_s > 0 and {4096, 4 * 1024 * 1024} <= set(auto.probes)
    assert auto.probes[4 * 1024 * 1024] > auto.probes[4096] > 0
    assert auto.backward_s == max(auto.ready_s) > 0 and auto.outside_s > 0
    order = [i for b in auto.buckets for i in b]
    assert sorted(order) == list(range(len(sizes)))
    cost = LinkCost(auto.alpha_s, auto.beta_s, auto.cpu_alpha_s, auto.cpu_beta_s, auto.compute_rate)
    assert 0 < auto.compute_rate <= 1 and auto.cpu_alpha_s >= 0 and auto.cpu_beta_s >= 0
    assert all(0 <= auto.probes_cpu_s[n] <= auto.probes[n] for n in auto.probes)
    fixed = buckets_for_cap(sizes, order, 25.0)
    expected = choose_buckets(auto.ready_s, sizes, order, cost, 2, None, fixed, auto.outside_s, AUTO_MIN_GAIN)
    assert auto.buckets == expected and auto.kept_cap25 == (expected == fixed)
    assert auto.bucket_mb == pytest.approx([sum(sizes[i] for i in b) / 2**20 for b in auto.buckets])
    in_use = fixed if auto.reverted else auto.buckets
    assert runs[0]["stats_bytes"] == [sum(sizes[i] for i in b) for b in in_use]
    assert auto.predicted_step_s <= auto.predicted_step_s_cap25 + 1e-12


def test_a_fast_link_is_probed_at_the_gradients_size_too(runs: list[dict]) -> None:
    assert runs[0]["probe_sizes"] == [[4096, 4 * 2**20], [4096, 4 * 2**20, 2**24 + 4]]


def test_auto_logged_once_on_rank0_only(runs: list[dict]) -> None:
    assert [m for m in runs[0]["messages"] if "auto" in m] and len(runs[0]["messages"]) == 1
    assert runs[1]["messages"] == []
    assert "buckets of" in runs[0]["messages"][0] and "alpha" in runs[0]["messages"][0]


def test_bad_bucket_cap_names_auto() -> None:
    with pytest.raises(ConfigError, match="'auto'"):
        DDPStrategy(bucket_cap_mb="big")  # type: ignore[arg-type]
    assert DDPStrategy(bucket_cap_mb="auto").bucket_cap_mb == "auto"


def test_bad_bucket_cap_in_reducer(runs: list[dict]) -> None:
    assert runs[0]["bad"] is not None and "'auto'" in runs[0]["bad"]


def _trial_run(rank: int, world_size: int, slow: str) -> dict:
    """auto forced to try two buckets (halves of the ready order; 25 MB holds the model in one after a
    1 MB first bucket); backward made 100 ms slower with the `slow` layout ("new" or "old")."""
    import strategies.autotune as autotune

    torch.set_num_threads(1)

    def choose(ready: list[float], sizes: list[int], order: list[int], *rest: object) -> list[list[int]]:
        return [order[: len(order) // 2], order[len(order) // 2 :]]  # called on rank 0 only

    autotune.choose_buckets = choose
    model = make(Deep)
    reducer = Reducer(model, bucket_cap_mb="auto")
    initial = reducer.bucket_indices

    def delay(grad: torch.Tensor) -> torch.Tensor:
        tried = reducer.auto is not None and reducer.bucket_indices == reducer.auto.buckets
        if tried == (slow == "new"):
            time.sleep(0.1)
        return grad

    model.layers[0].weight.register_hook(delay)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    layouts = []
    for step in range(STEPS):
        ours_step(model, reducer, opt, *_batch(step, rank))
        layouts.append(reducer.bucket_indices)
    return {"auto": reducer.auto, "layouts": layouts, "initial": initial}


@pytest.mark.parametrize("slow", ["new", "old"])
def test_a_trial_keeps_the_new_buckets_only_if_they_measured_faster(slow: str) -> None:
    from conftest import run_distributed

    runs = run_distributed(_trial_run, slow, timeout=300.0)
    for result in runs:
        auto, layouts = result["auto"], result["layouts"]
        n = len(auto.ready_s)
        assert not auto.kept_cap25 and [len(b) for b in auto.buckets] == [n // 2, n - n // 2]
        assert auto.reverted == (slow == "new")
        fixed = layouts[AUTO_ITERATIONS]  # the trial's second backward ran with the 25 MB buckets
        assert fixed != auto.buckets and len(fixed) <= 2
        assert layouts == _expected_layouts(auto, result["initial"], fixed)
        if slow == "new":
            assert auto.sync_s_trial > auto.sync_s_cap25 + 0.05 and auto.trial_wins == 0
        else:
            assert auto.sync_s_trial < auto.sync_s_cap25 - 0.05 and auto.trial_wins == TRIAL_ITERATIONS // 2
    assert runs[0]["auto"].reverted == runs[1]["auto"].reverted
