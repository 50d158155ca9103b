"""What Tandem's safety mechanisms cost, measured side by side in one run (2 gloo processes on 127.0.0.1):

- per-step join (an all-reduce of one int per step; on only when some rank's loader has no length): blocking,
  as Tandem ran it before 2026-11-28, and pipelined as it runs it now (strategies/agreement.py: started without
  waiting, its answer read two steps later; the stop-request agreement at every step boundary is the same),
- atomic checkpoint writes (temp file + fsync + rename) against a plain torch.save.

Prints a table and writes benchmarks/results/reliability.json.  Usage: python benchmarks/reliability.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from strategies.agreement import Pipelined  # noqa: E402
from trainer.checkpoint import atomic_save  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, port: int, steps: int, queue: mp.Queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(4)])
    x = torch.randn(64, 256)
    grads_flat = torch.zeros(sum(p.numel() for p in model.parameters()))

    pipelined = Pipelined(lambda op, fn, *args: fn(*args), torch.device("cpu"), "join all-reduce")

    def step(join: bool | str) -> None:
        if join == "pipelined":
            pipelined.post(0)
            if pipelined.ready:
                pipelined.take()
        elif join:
            flag = torch.ones(1, dtype=torch.int32)
            dist.all_reduce(flag, op=dist.ReduceOp.MIN)
            bool(flag.item())
        model.zero_grad()
        model(x).square().mean().backward()
        dist.all_reduce(grads_flat)  # stands in for the gradient reduction of a real step

    variants = (("step", False), ("step + join", True), ("step + pipelined join", "pipelined"))
    times: dict[str, list[float]] = {name: [] for name, _ in variants}
    for _ in range(10):
        for _, join in variants:
            step(join)
    for _ in range(steps):
        for name, join in variants:  # interleaved against machine noise
            dist.barrier()
            t0 = time.perf_counter()
            step(join)
            times[name].append(time.perf_counter() - t0)
    pipelined.drain()
    flag = torch.zeros(1, dtype=torch.int32)
    t0 = time.perf_counter()
    for _ in range(steps):
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    one_allreduce = (time.perf_counter() - t0) / steps
    if rank == 0:
        queue.put(
            {k: statistics.median(v) * 1e3 for k, v in times.items()}
            | {"tiny all-reduce": one_allreduce * 1e3}
        )
    dist.destroy_process_group()


def collectives(steps: int) -> dict[str, float]:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, port, steps, queue)) for r in range(2)]
    for p in procs:
        p.start()
    out = queue.get(timeout=300)
    for p in procs:
        p.join()
    return out


def checkpoint_writes(reps: int, mb: int) -> dict[str, float]:
    obj = {"state_dict": {"w": torch.randn(mb * 262144)}}
    out: dict[str, list[float]] = {"torch.save": [], "atomic_save": []}
    with tempfile.TemporaryDirectory() as d:
        for _ in range(reps):
            t0 = time.perf_counter()
            torch.save(obj, os.path.join(d, "plain.ckpt"))
            out["torch.save"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            atomic_save(obj, os.path.join(d, "atomic.ckpt"))
            out["atomic_save"].append(time.perf_counter() - t0)
    return {k: statistics.median(v) * 1e3 for k, v in out.items()}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    c = collectives(50 if args.quick else 300)
    w = checkpoint_writes(3 if args.quick else 7, 40)
    join_cost = c["step + join"] / c["step"] - 1
    rows = [
        ("DDP step (4 x Linear 256, batch 64), ms", c["step"]),
        ("same step + per-step join, ms", c["step + join"]),
        ("join overhead, %", 100 * join_cost),
        ("same step + pipelined join, ms", c["step + pipelined join"]),
        ("pipelined join overhead, %", 100 * (c["step + pipelined join"] / c["step"] - 1)),
        ("one 1-element all-reduce, ms", c["tiny all-reduce"]),
        ("stop check (1 all-reduce / 10 steps), % of step", 100 * c["tiny all-reduce"] / 10 / c["step"]),
        ("40 MB checkpoint, torch.save, ms", w["torch.save"]),
        ("40 MB checkpoint, atomic_save (fsync+rename), ms", w["atomic_save"]),
    ]
    width = max(len(r[0]) for r in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value:8.2f}")
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "reliability.json"), "w") as f:
        json.dump(dict(rows), f, indent=2)


if __name__ == "__main__":
    main()
