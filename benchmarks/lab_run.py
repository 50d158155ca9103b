"""Run one worker per node of a fresh two-node lab (benchmarks/lab.py) and collect rank 0's JSON.

Each worker gets torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR/PORT), gloo bound to the lab's
interface, one torch thread, and ``--out <file>``, where rank 0 writes its results.

    results = run_two_node("1gbit", [sys.executable, "benchmarks/cluster.py", "--worker", ...], 1200)
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PORT = 29517


def run_two_node(rate: str, argv: list[str], timeout: float) -> dict:
    """Bring a lab up at `rate` ("unlimited" for none), run `argv` on both nodes, return rank 0's JSON."""
    from benchmarks.lab import Lab, guarded

    with guarded(Lab.up(None if rate == "unlimited" else rate)) as lab, tempfile.TemporaryDirectory() as tmp:
        out_path = os.path.join(tmp, "rank0.json")
        procs = []
        for node in (0, 1):
            env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE", "MASTER_"))}
            env.update(
                RANK=str(node),
                WORLD_SIZE="2",
                MASTER_ADDR=lab.addr(0),
                MASTER_PORT=str(PORT),
                GLOO_SOCKET_IFNAME=lab.iface(node),
                PYTHONPATH=ROOT,
                OMP_NUM_THREADS="1",
            )
            cmd = [*argv, "--out", out_path]
            procs.append(lab.popen(node, cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + timeout
        for proc in procs:
            try:
                output, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"rate {rate}: workers did not finish within {timeout:.0f} s") from None
            if proc.returncode != 0:
                raise RuntimeError(f"rate {rate}: a worker failed ({proc.returncode}):\n{output[-3000:]}")
        with open(out_path) as f:
            return json.load(f)
