"""Reference tests of the bucketed-overlap Reducer against torch DDP and a single process (2 gloo ranks)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers.reducer_models import (
    BATCH,
    CAP_MB,
    Branchy,
    K,
    Mixed,
    WithBatchNorm,
    assert_grads_close,
    batch,
    ddp_step,
    gathered,
    grads,
    make,
    ours_step,
)
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from strategies.reducer import AUTO_ITERATIONS, Reducer
from tandem_core.errors import DistributedError

# ---------------------------------------------------------------- one spawn for every distributed check


def _all_scenarios(rank: int, world_size: int) -> dict:
    """Each process start costs seconds of imports, so every scenario runs in the same two processes."""
    return {
        "reference": _reference(rank, world_size),
        "unused": _unused_and_mismatch(rank, world_size),
        "no_sync": _no_sync_and_hooks(rank, world_size),
    }


@pytest.fixture(scope="module")
def runs() -> list[dict]:
    # dist_run is per test; at module scope import the helper it returns, so one spawn serves every test.
    from conftest import run_distributed

    return run_distributed(_all_scenarios, timeout=300.0)


# ---------------------------------------------------------------- gradients == torch DDP == one process


def _reference(rank: int, world_size: int) -> dict:
    out: dict = {}
    # "auto" runs until one step past its rebuild (its layout is chosen after AUTO_ITERATIONS backwards)
    for view, cap, steps in ((True, CAP_MB, 2), (False, CAP_MB, 2), (True, "auto", AUTO_ITERATIONS + 1)):
        ours = make(Mixed)
        reducer = Reducer(ours, bucket_cap_mb=cap, gradient_as_bucket_view=view)
        ddp = DDP(make(Mixed), bucket_cap_mb=CAP_MB, gradient_as_bucket_view=view)
        single = make(Mixed)
        opts = [torch.optim.SGD(m.parameters(), lr=0.5) for m in (ours, ddp, single)]
        rec: dict[str, list] = {
            "ours": [],
            "ddp": [],
            "single": [],
            "buckets": [],
            "stats": [],
            "is_view": [],
        }
        for step in range(steps):
            rec["buckets"].append(gathered(reducer.bucket_indices))
            rec["ours"].append(ours_step(ours, reducer, opts[0], *batch(step, rank)))
            rec["stats"].append(list(reducer.stats))
            rec["is_view"].append([p.grad._base is not None for p in reducer.params])
            rec["ddp"].append(ddp_step(ddp, opts[1], *batch(step, rank)))
            opts[2].zero_grad(set_to_none=True)
            F.cross_entropy(single(batch(step, None)[0]), batch(step, None)[1]).backward()
            rec["single"].append(grads(single))
            opts[2].step()
        rec["buckets"].append(gathered(reducer.bucket_indices))
        rec["sizes"] = [p.numel() * p.element_size() for p in reducer.params]
        rec["numel"] = {
            str(dt): sum(p.numel() for p in reducer.params if p.dtype == dt)
            for dt in (torch.float32, torch.float64)
        }
        out[f"view={view}" if cap == CAP_MB else f"cap={cap}"] = rec

    # BatchNorm: buffers broadcast at construction and before each forward, as torch DDP does.
    ours, theirs = make(WithBatchNorm), make(WithBatchNorm)
    for m in (ours, theirs):
        m.net[1].running_mean.fill_(float(rank))  # differs per rank until broadcast
    reducer = Reducer(ours, bucket_cap_mb=CAP_MB)
    out["bn_after_init"] = ours.net[1].running_mean.clone()
    ddp = DDP(theirs, bucket_cap_mb=CAP_MB)
    opts = [torch.optim.SGD(m.parameters(), lr=0.5) for m in (ours, theirs)]
    out["bn"] = [
        (ours_step(ours, reducer, opts[0], *batch(s, rank)), ddp_step(ddp, opts[1], *batch(s, rank)))
        for s in range(2)
    ]
    out["bn_buffers"] = (
        {k: v.clone() for k, v in ours.state_dict().items()},
        {k: v.clone() for k, v in theirs.state_dict().items()},
    )
    reducer.sync_buffers()
    out["bn_synced"] = ours.net[1].running_var.clone()
    return out


@pytest.fixture(scope="module")
def reference(runs: list[dict]) -> list[dict]:
    return [r["reference"] for r in runs]


@pytest.mark.parametrize("variant", ["view=True", "view=False", "cap=auto"])
def test_grads_match_ddp_and_single_process(reference: list[dict], variant: str) -> None:
    view = variant != "view=False"
    for rank, result in enumerate(reference):
        rec = result[variant]
        for step in range(len(rec["ours"])):
            assert_grads_close(rec["ours"][step], rec["ddp"][step], what=f"rank {rank} step {step} vs DDP")
            assert_grads_close(
                rec["ours"][step], rec["single"][step], what=f"rank {rank} step {step} vs single"
            )
            assert all(rec["is_view"][step]) == view  # .grad aliases the bucket only in view mode
        assert rec["ours"][0]["frozen.weight"] is None and "head.weight" not in rec["ours"][0]


def test_bucket_assignment_identical_across_ranks_and_capped(reference: list[dict]) -> None:
    rec = reference[0]["view=True"]
    before, after = rec["buckets"][0], rec["buckets"][2]
    assert before[0] == before[1] and after[0] == after[1]  # every rank, before and after the rebuild
    assert before[0] != after[0], "the rebuild should follow the gradient-ready order"
    assert rec["buckets"][1] == rec["buckets"][2], "buckets are rebuilt once only"
    sizes, cap = rec["sizes"], int(CAP_MB * 1024 * 1024)
    for buckets in (before[0], after[0]):
        assert sorted(i for b in buckets for i in b) == list(range(len(sizes)))
        assert len(buckets) > 5
        for b in buckets:
            assert len(b) == 1 or sum(sizes[i] for i in b) <= cap


def test_stats_sane(reference: list[dict]) -> None:
    rec = reference[0]["view=False"]
    for stats in rec["stats"]:
        assert [s.index for s in stats] == list(range(len(stats)))
        for s in stats:
            assert 0.0 <= s.ready_s <= s.launch_s <= s.done_s and s.wait_s >= 0.0
            assert s.nbytes == s.numel * s.dtype.itemsize and s.param_names
        for dtype, numel in rec["numel"].items():
            assert sum(s.numel for s in stats if str(s.dtype) == dtype) == numel


def test_batchnorm_buffers_follow_rank0(reference: list[dict]) -> None:
    assert all(torch.equal(r["bn_after_init"], torch.zeros(8)) for r in reference)
    for rank, result in enumerate(reference):
        for step, (ours, theirs) in enumerate(result["bn"]):
            assert_grads_close(ours, theirs, what=f"rank {rank} step {step} BatchNorm vs DDP")
        mine, ddp_buffers = result["bn_buffers"]
        for key in ("net.1.running_mean", "net.1.running_var", "net.1.num_batches_tracked"):
            torch.testing.assert_close(mine[key], ddp_buffers[key], atol=1e-6, rtol=0)
    assert not torch.equal(
        reference[0]["bn_buffers"][0]["net.1.running_var"], reference[1]["bn_buffers"][0]["net.1.running_var"]
    )
    assert torch.equal(reference[0]["bn_synced"], reference[1]["bn_synced"])


# ---------------------------------------------------------------- unused parameters, mismatched ranks


def _unused_and_mismatch(rank: int, world_size: int) -> dict:
    out: dict = {}
    x, y = torch.randn(2 * BATCH, 8, generator=torch.Generator().manual_seed(3)), torch.arange(2 * BATCH) % 2
    x, y = x[rank * BATCH : (rank + 1) * BATCH], y[rank * BATCH : (rank + 1) * BATCH]
    model = make(Branchy)
    reducer = Reducer(model, bucket_cap_mb=CAP_MB)
    try:
        ours_step(model, reducer, torch.optim.SGD(model.parameters(), lr=0.1), x, y, True)
        out["error"] = None
    except DistributedError as e:
        out["error"] = str(e)
    for view, pass_outputs in ((True, True), (False, True), (True, False)):
        ours, theirs = make(Branchy), make(Branchy)
        reducer = Reducer(
            ours, bucket_cap_mb=CAP_MB, gradient_as_bucket_view=view, find_unused_parameters=True
        )
        ddp = DDP(theirs, bucket_cap_mb=CAP_MB, gradient_as_bucket_view=view, find_unused_parameters=True)
        opts = [torch.optim.SGD(m.parameters(), lr=0.5) for m in (ours, theirs)]
        out[(view, pass_outputs)] = [
            (  # without the loss, unused parameters are only found in finalize
                ours_step(ours, reducer, opts[0], x, y, rank == 0, give_loss=pass_outputs),
                ddp_step(ddp, opts[1], x, y, rank == 0),
            )
            for _ in range(2)
        ]
    model = make(Branchy)
    reducer = Reducer(model, find_unused_parameters=True)
    loss = F.cross_entropy(model(x, True), y)
    reducer.prepare_for_backward(loss)
    loss.backward(retain_graph=True)
    try:  # a second backward after one prepare_for_backward would be reduced twice
        loss.backward()
        out["twice"] = None
    except DistributedError as e:
        out["twice"] = str(e)
    reducer.finalize()  # the same buckets were launched on both ranks: nothing hangs
    try:
        Reducer(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 3 + rank)))
        out["mismatch"] = None
    except DistributedError as e:
        out["mismatch"] = str(e)
    return out


@pytest.fixture(scope="module")
def unused(runs: list[dict]) -> list[dict]:
    return [r["unused"] for r in runs]


def test_unused_parameter_error_names_it(unused: list[dict]) -> None:
    for result in unused:
        assert result["error"] is not None and "'unused.weight'" in result["error"]
        assert "find_unused_parameters=True" in result["error"] and "first.weight" not in result["error"]


@pytest.mark.parametrize("variant", [(True, True), (False, True), (True, False)])
def test_find_unused_parameters_matches_ddp(unused: list[dict], variant: tuple[bool, bool]) -> None:
    for rank, result in enumerate(unused):
        for step, (ours, theirs) in enumerate(result[variant]):
            assert_grads_close(ours, theirs, what=f"rank {rank} step {step}")
            assert ours["unused.weight"] is None and ours["sometimes.weight"] is not None


def test_second_backward_without_prepare_raises(unused: list[dict]) -> None:
    for result in unused:
        assert result["twice"] is not None and "no_sync()" in result["twice"]


def test_mismatched_shapes_fail_at_construction(unused: list[dict]) -> None:
    for result in unused:
        assert result["mismatch"] is not None and "'1.weight'" in result["mismatch"]
        assert "[3, 4]" in result["mismatch"] and "[4, 4]" in result["mismatch"]


# ---------------------------------------------------------------- no_sync and compression hooks


def _no_sync_and_hooks(rank: int, world_size: int, k: int = K) -> dict:
    out: dict = {}
    for view in (True, False):
        ours, theirs = make(Mixed), make(Mixed)
        reducer = Reducer(ours, bucket_cap_mb=CAP_MB, gradient_as_bucket_view=view)
        ddp = DDP(theirs, bucket_cap_mb=CAP_MB, gradient_as_bucket_view=view)
        windows = []
        for window in range(2):
            micro = [batch(10 * window + j, rank) for j in range(k)]
            for m in (ours, theirs):
                m.zero_grad(set_to_none=True)
            with reducer.no_sync(), ddp.no_sync():
                for x, y in micro[:-1]:
                    loss = F.cross_entropy(ours(x), y)
                    reducer.prepare_for_backward(loss)  # as a strategy would: no_sync makes it a no-op
                    loss.backward()
                    F.cross_entropy(ddp(x), y).backward()
            loss = F.cross_entropy(ours(micro[-1][0]), micro[-1][1])
            reducer.prepare_for_backward(loss)
            loss.backward()
            reducer.finalize()
            F.cross_entropy(ddp(micro[-1][0]), micro[-1][1]).backward()
            windows.append((grads(ours), grads(theirs)))
        out[view] = windows
    # torch's bf16 hook needs NCCL, so bf16 is compared with uncompressed DDP (within bf16 tolerance).
    for name, hook in (("fp16", default_hooks.fp16_compress_hook), ("bf16", None)):
        ours, theirs = make(Mixed), make(Mixed)
        reducer = Reducer(ours, bucket_cap_mb=CAP_MB, comm_hook=name)
        ddp = DDP(theirs, bucket_cap_mb=CAP_MB)
        if hook is not None:
            ddp.register_comm_hook(None, hook)
        opts = [torch.optim.SGD(m.parameters(), lr=0.5) for m in (ours, theirs)]
        out[name] = (
            ours_step(ours, reducer, opts[0], *batch(0, rank)),
            ddp_step(ddp, opts[1], *batch(0, rank)),
        )
    return out


def test_no_sync_accumulation_matches_ddp_and_local_sum(runs: list[dict]) -> None:
    result = [r["no_sync"] for r in runs]
    for view in (True, False):
        for window in range(2):
            local = make(Mixed)  # every micro-batch of every rank, accumulated locally, averaged over ranks
            for r in range(2):
                for j in range(K):
                    x, y = batch(10 * window + j, r)
                    (F.cross_entropy(local(x), y) / 2).backward()
            for rank in range(2):
                ours, theirs = result[rank][view][window]
                assert_grads_close(ours, theirs, what=f"view={view} window {window} rank {rank} vs DDP")
                assert_grads_close(
                    ours, grads(local), atol=1e-5, what=f"view={view} window {window} vs local"
                )


def test_compression_hooks_close_to_ddp(runs: list[dict]) -> None:
    result = [r["no_sync"] for r in runs]
    for name, dtype, tol in (("fp16", torch.float16, 2e-3), ("bf16", torch.bfloat16, 2e-2)):
        for rank in range(2):
            ours, theirs = result[rank][name]
            assert_grads_close(ours, theirs, atol=tol, rtol=tol, what=f"{name} rank {rank}")
            for g in ours.values():  # the result came back through the compressed dtype
                if g is not None and g.dtype == torch.float32:
                    assert torch.equal(g, g.to(dtype).float())
