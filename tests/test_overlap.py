"""Overlap regression: the Reducer launches its buckets during backward, without blocking it, on 2 gloo ranks."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from strategies.reducer import Reducer

WIDTH, DEPTH, BATCH = 256, 8, 256  # backward: tens of ms on one core, 16 parameters
CAP_MB = 0.3  # one 256x256 float32 weight (0.25 MB) per bucket, so there are about DEPTH buckets
FREE_STEPS = 3  # the first runs before the bucket rebuild, the others after it
GATE_TIMEOUT_S = 30.0


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*(m for _ in range(DEPTH) for m in (nn.Linear(WIDTH, WIDTH), nn.Tanh())))


def _wait_for(path: str) -> Callable[[torch.Tensor], None]:
    """A hook on rank 1's loss: its backward starts only once rank 0's backward has returned."""

    def hook(grad: torch.Tensor) -> None:
        deadline = time.monotonic() + GATE_TIMEOUT_S
        while not os.path.exists(path):
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"rank 0's backward did not return in {GATE_TIMEOUT_S:.0f} s while rank 1 had launched "
                    "nothing: a collective blocked rank 0's backward instead of running beside it"
                )
            time.sleep(0.005)

    return hook


def _step(model: nn.Module, reducer: Reducer, rank: int, gate: str | None) -> dict:
    """One synchronised step; with `gate`, rank 1's backward waits until rank 0's has returned."""
    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(BATCH, WIDTH, generator=g), torch.randn(BATCH, WIDTH, generator=g)
    model.zero_grad(set_to_none=True)
    loss = F.mse_loss(model(x), y)
    if gate is not None and rank == 1:
        loss.register_hook(_wait_for(gate))
    reducer.prepare_for_backward(loss)
    loss.backward()
    if gate is not None and rank == 0:
        open(gate, "w").close()  # only now may rank 1 produce (and launch) any gradient at all
    reducer.finalize()
    return {
        "ready_s": [s.ready_s for s in reducer.stats],
        "launch_s": [s.launch_s for s in reducer.stats],
        "last_grad_s": reducer.last_grad_s,
    }


def _overlap(rank: int, world_size: int, gate: str) -> list[dict]:
    model = _model()
    reducer = Reducer(model, bucket_cap_mb=CAP_MB, first_bucket_cap_mb=CAP_MB)
    steps = [_step(model, reducer, rank, None) for _ in range(FREE_STEPS)]
    steps.append(_step(model, reducer, rank, gate))
    return steps


def test_buckets_launch_during_backward_without_blocking_it(dist_run, tmp_path) -> None:
    runs = dist_run(_overlap, str(tmp_path / "rank0_backward_returned"), timeout=180.0)
    for rank, steps in enumerate(runs):
        for k, step in enumerate(steps):
            where = f"rank {rank}, step {k}{' (gated)' if k == FREE_STEPS else ''}"
            ready, launch, last_grad = step["ready_s"], step["launch_s"], step["last_grad_s"]
            assert len(launch) >= 4, f"{where}: the model should span several buckets, got {len(launch)}"
            assert launch == sorted(launch), f"{where}: buckets launched out of index order: {launch}"
            assert all(r <= t for r, t in zip(ready, launch)), f"{where}: launched before ready"
            assert last_grad > 0.0, f"{where}: the last gradient's arrival was not recorded"
            # Orders of events, not durations: the last gradients are layer 0's, and at most the last two
            # buckets hold any of them (bias and weight may arrive in either order); every other bucket is
            # complete in a gradient hook before then, so its all-reduce must have been launched by then.
            during = [t < last_grad for t in launch]
            assert all(during[:-2]), (
                f"{where}: buckets {[i for i, d in enumerate(during) if not d]} of {len(launch)} were "
                f"launched after the last gradient ({last_grad * 1e3:.2f} ms): launch_s "
                f"{[round(t * 1e3, 2) for t in launch]} ms, not overlapped with backward"
            )
