"""FSDPStrategy(fault_tolerance=...): HSDP with in-place recovery, on loopback. Two replica groups of two ranks
each (each group its own torchrun, sharding over its ranks; the lighthouse in this process) train as plain
FSDP over the four ranks does (float64, to rounding), and a group's sharded weights and optimizer states, moved
as local shards, put another group exactly where the first one is."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist

from strategies.fault_tolerance.manager import require_torchft
from strategies.fault_tolerance.shards import load_optimizer, load_weights, to_local
from tests.conftest import ROOT, run_distributed

pytestmark = pytest.mark.slow
SCRIPT = os.path.join(ROOT, "tests", "scripts", "replica_train.py")


def _env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("TORCHELASTIC_", "RANK", "WORLD_SIZE", "MASTER_", "LOCAL_"))
    }
    return {**env, "PYTHONUNBUFFERED": "1", "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1", **extra}


def _torchrun(nproc: int, out: str, *args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", SCRIPT, out,
            "--strategy", "fsdp", "--epochs", "1", *args]  # fmt: skip
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def test_hsdp_without_failures_trains_as_plain_fsdp_over_every_rank(tmp_path):
    pytest.importorskip("torchft", reason="needs the fault-tolerance extra (make test-slow installs it)")
    require_torchft()  # (quiets torchft's logs of every quorum, as a job's would be)
    from torchft._torchft import LighthouseServer

    lighthouse = LighthouseServer(bind="127.0.0.1:0", min_replicas=2, join_timeout_ms=1000, quorum_tick_ms=50)
    url = f"http://127.0.0.1:{lighthouse.address().rsplit(':', 1)[1]}"
    start = time.monotonic()
    try:
        groups = [
            _torchrun(2, str(tmp_path), "--min-replicas", "2",
                      env=_env(TANDEM_REPLICA_GROUP=str(g), TANDEM_REPLICA_GROUPS="2", TORCHFT_LIGHTHOUSE=url))
            for g in (0, 1)
        ]  # fmt: skip
        outputs = [p.communicate(timeout=600)[0] for p in groups]
    finally:
        lighthouse.shutdown()
    for p, out in zip(groups, outputs):
        assert p.returncode == 0, out[-4000:]
    ft_s = time.monotonic() - start
    plain = _torchrun(4, str(tmp_path), "--plain", env=_env())
    out = plain.communicate(timeout=600)[0]
    assert plain.returncode == 0, out[-4000:]
    w0, w1 = torch.load(tmp_path / "group0.pt"), torch.load(tmp_path / "group1.pt")
    ref = torch.load(tmp_path / "plain.pt")
    for k in ref:
        assert torch.equal(w0[k], w1[k]), k  # the two groups hold the same weights
        assert torch.allclose(w0[k], ref[k], rtol=0, atol=1e-12), (k, (w0[k] - ref[k]).abs().max())
    assert not torch.equal(ref["net.0.weight"], torch.load(tmp_path / "group0.pt")["net.0.weight"] * 0)
    print(f"\nHSDP 2 groups x 2 ranks: {ft_s:.0f}s; equal to plain FSDP over 4 ranks to 1e-12")


def _move_shards(rank: int, world: int) -> bool:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (2,))

    def build(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(seed)
        model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3)).double()
        fully_shard(model, mesh=mesh)
        return model, torch.optim.AdamW(model.parameters(), lr=0.05)

    def step(model: torch.nn.Module, opt: torch.optim.Optimizer, i: int) -> None:
        g = torch.Generator().manual_seed(100 * i + dist.get_rank())
        model(torch.randn(4, 6, generator=g, dtype=torch.float64)).square().sum().backward()
        opt.step()
        opt.zero_grad()

    live, live_opt = build(0)
    for i in range(3):
        step(live, live_opt, i)
    buf = io.BytesIO()  # as SafeTransport carries it
    torch.save({"w": to_local(live.state_dict()), "o": to_local(live_opt.state_dict())}, buf)
    got = torch.load(io.BytesIO(buf.getvalue()), weights_only=True)
    joining, joining_opt = build(7)  # another start: other weights, an optimizer without state
    load_weights(joining, got["w"])
    load_optimizer(joining_opt, got["o"])
    for i in range(3, 5):
        step(live, live_opt, i)
        step(joining, joining_opt, i)
    return all(
        torch.equal(a.full_tensor(), b.full_tensor()) for a, b in zip(live.parameters(), joining.parameters())
    )


def test_sharded_weights_and_optimizer_states_move_as_local_shards():
    assert run_distributed(_move_shards, world_size=2) == [True, True]
