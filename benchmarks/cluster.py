"""Two nodes over a rate-limited link: bucket_cap_mb="auto" against 25 MB buckets, torch DDP and flat.

Each link rate gets a fresh network lab (benchmarks/lab.py: two namespaces, tc tbf on the veth pair) and
one gloo worker per node, one torch thread each. Per model, every method trains its own copy of the same
model: warm-up steps (enough for "auto" to measure and rebuild), then the median of timed steps.

    sudo python benchmarks/cluster.py                  # the full grid, about 5-10 minutes
    sudo python benchmarks/cluster.py --rates 1gbit --models one_bucket --steps 3   # a quick look

Writes benchmarks/results/cluster.json and, with matplotlib, docs/img/cluster_costmodel.png (predicted
step time vs bucket size and vs world size, from the cost model fed with the measured numbers).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from collections.abc import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # first: benchmarks/ (a script's sys.path[0]) holds a strategies.py

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from benchmarks.cluster_report import AGAIN, METHODS, RATES, curves, plot, print_table, summarise  # noqa: E402
from benchmarks.lab_run import run_two_node  # noqa: E402
from strategies.reducer import AUTO_ITERATIONS, TRIAL_ITERATIONS, Reducer  # noqa: E402

RESULTS = os.path.join(ROOT, "benchmarks", "results", "cluster.json")
WARMUP_STEPS = AUTO_ITERATIONS + TRIAL_ITERATIONS + 2
BLOCK = 4  # timed steps run in blocks of this many per method, the first untimed


def one_bucket() -> nn.Module:
    """Fits one 25 MB bucket: Linear 256->1024->1024->256->10 (8 tensors, 6.3 MB)."""
    return nn.Sequential(
        nn.Linear(256, 1024),
        nn.ReLU(),
        nn.Linear(1024, 1024),
        nn.ReLU(),
        nn.Linear(1024, 256),
        nn.Linear(256, 10),
    )


def few_large() -> nn.Module:
    """Few large tensors: Linear 512->2048->2048->10 (6 tensors, 21 MB)."""
    return nn.Sequential(
        nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 10)
    )


def many_small() -> nn.Module:
    """Many small tensors: 60 x [Linear 64x64 + LayerNorm] (240 tensors, 1 MB)."""
    return nn.Sequential(*(nn.Sequential(nn.Linear(64, 64), nn.LayerNorm(64)) for _ in range(60)))


MODELS: dict[str, tuple[Callable[[], nn.Module], int, int]] = {  # builder, batch, input width
    "one_bucket": (one_bucket, 128, 256),
    "few_large": (few_large, 64, 512),
    "many_small": (many_small, 256, 64),
}


# ------------------------------------------------------------------------------------------ worker


def _method(method: str, name: str) -> tuple[Callable[[], None], dict[str, list[float]], Reducer | None]:
    """One method's copy of the model (same weights and batches for every method) and its step."""
    build, batch, width = MODELS[name]
    torch.manual_seed(0)
    model = build()
    rank = dist.get_rank()
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(batch, width, generator=g)
    y = torch.randn(batch, width) if name == "many_small" else torch.randint(0, 10, (batch,), generator=g)
    reducer = net = None
    if method in ("tandem_auto", "tandem_cap25", AGAIN):
        reducer = Reducer(model, bucket_cap_mb="auto" if method == "tandem_auto" else 25.0)
    elif method == "torch_ddp":
        net = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    params = [p for p in model.parameters() if p.requires_grad]
    parts: dict[str, list[float]] = {"step": [], "forward": [], "backward": [], "optim": [], "allreduce": []}

    def one_step() -> None:
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        out = (net or model)(x)
        loss = F.mse_loss(out, y) if out.shape == y.shape else F.cross_entropy(out, y)
        t1 = time.perf_counter()
        if reducer is not None:
            reducer.prepare_for_backward(loss)
        loss.backward()
        if reducer is not None:
            reducer.finalize()
        t2 = time.perf_counter()
        if method == "flat":
            flat = torch.cat([p.grad.reshape(-1) for p in params])
            dist.all_reduce(flat)
            flat /= dist.get_world_size()
            for p, part in zip(params, flat.split([p.numel() for p in params])):
                p.grad.copy_(part.view_as(p))
        t3 = time.perf_counter()
        opt.step()
        t4 = time.perf_counter()
        for key, value in (
            ("forward", t1 - t0),
            ("backward", t2 - t1),
            ("allreduce", t3 - t2),
            ("optim", t4 - t3),
        ):
            parts[key].append(value)
        parts["step"].append(t4 - t0)

    return one_step, parts, reducer


def _time_model(name: str, steps: int, methods: tuple[str, ...]) -> dict:
    """ms/step of every method on one model. Each warms up alone ("auto" measures, tries and decides in
    its warm-up, from steps run back to back as in training). Then the methods take turns in blocks of
    BLOCK steps, the first of each block untimed (caches refill) and the order rotated every round, so
    that a change in the machine's load falls on all of them alike."""
    runs = {m: _method(m, name) for m in methods}
    for step, _, _ in runs.values():
        for _ in range(WARMUP_STEPS):
            step()
    dist.barrier()
    for _, parts, _ in runs.values():
        for p in parts.values():
            p.clear()
    timed = {m: 0 for m in methods}
    for r in range(-(-steps // (BLOCK - 1))):
        for method in methods[r % len(methods) :] + methods[: r % len(methods)]:
            step, parts, _ = runs[method]
            step()
            for p in parts.values():
                p.pop()  # the block's first step is not timed
            for _ in range(min(BLOCK - 1, steps - timed[method])):
                step()
            timed[method] = len(parts["step"])
    results = {}
    for method, (_, parts, reducer) in runs.items():
        out = {k: 1e3 * statistics.median(v) for k, v in parts.items()}
        if reducer is not None:
            out["bucket_mb"] = [s.nbytes / 2**20 for s in reducer.stats]
        if reducer is not None and reducer.auto is not None:
            out["auto"] = dataclasses.asdict(reducer.auto)
            out["sizes"] = [p.numel() * p.element_size() for p in reducer.params]
        results[method] = out
    return results


def worker(models: list[str], steps: int, out_path: str, aa: bool) -> None:
    """One rank: every model, every method; rank 0 writes the results."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    methods = (*METHODS, AGAIN) if aa else METHODS
    results = {name: _time_model(name, steps, methods) for name in models}
    if dist.get_rank() == 0:
        with open(out_path, "w") as f:
            json.dump(results, f)
    dist.barrier()
    dist.destroy_process_group()


# ------------------------------------------------------------------------------------------ driver


def run_rate(rate: str, models: list[str], steps: int, timeout: float, aa: bool = False) -> dict:
    """Bring a lab up at `rate`, run both workers in it, return rank 0's results."""
    argv = [sys.executable, __file__, "--worker", *(["--aa"] if aa else []), "--models", *models]
    return run_two_node(rate, [*argv, "--steps", str(steps)], timeout)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rates", nargs="+", default=list(RATES))
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--steps", type=int, default=21, help="timed steps per method (after the warm-up)")
    p.add_argument("--timeout", type=float, default=1200.0, help="seconds per rate")
    p.add_argument("--replot", action="store_true", help="only redraw the plot from the JSON")
    p.add_argument("--results", default=RESULTS, help="where to write (or, with --replot, read) the JSON")
    p.add_argument("--aa", action="store_true", help="also time a second copy of cap 25 (the noise floor)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args.models, args.steps, args.out, args.aa)
        return 0
    if args.replot:
        with open(args.results) as f:
            plot(json.load(f)["curves"])
        return 0
    from benchmarks.lab import unavailable

    reason = unavailable()
    if reason:
        print(f"skipped: {reason}")
        return 0
    results, started = {}, time.time()
    for rate in args.rates:
        t = time.monotonic()
        results[rate] = run_rate(rate, args.models, args.steps, args.timeout, args.aa)
        print(f"{rate}: {time.monotonic() - t:.0f} s", flush=True)
    rows = summarise(results)
    print_table(rows)
    c = curves(results)
    os.makedirs(os.path.dirname(os.path.abspath(args.results)), exist_ok=True)
    with open(args.results, "w") as f:
        json.dump(
            {"started": started, "steps": args.steps, "rows": rows, "curves": c, "raw": results}, f, indent=1
        )
    print(f"wrote {args.results}")
    plot(c)
    return 0


if __name__ == "__main__":
    sys.exit(main())
