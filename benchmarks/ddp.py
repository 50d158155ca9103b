"""Side-by-side DDP benchmark: our bucketed Reducer vs torch DDP vs naive all-reduce schemes.

Two gloo processes on 127.0.0.1, one thread each. Every method trains its own copy of the same model in the
same run, interleaved in rounds, so the ratios are comparable even on a noisy machine.

    python benchmarks/ddp.py              # full run, writes benchmarks/results/ddp.json
    python benchmarks/ddp.py --quick      # a fast smoke run
    python benchmarks/ddp.py --timeline   # also plot one step's buckets (needs matplotlib)
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# First, even when PYTHONPATH has it: benchmarks/ (sys.path[0] for a script) holds a strategies.py.
sys.path.insert(0, ROOT)

from strategies.reducer import Reducer  # noqa: E402

RESULTS = os.path.join(ROOT, "benchmarks", "results")
METHODS = ("ours", "torch_ddp", "torch_ddp_view", "per_param", "flat", "no_comm")
SWEEP_MB = (0.05, 1.0, 5.0, 25.0, 100.0)


def model_a() -> nn.Module:
    """Many small parameters: 60 x [Linear 64x64 + LayerNorm] (240 tensors, ~1 MB)."""
    return nn.Sequential(*(nn.Sequential(nn.Linear(64, 64), nn.LayerNorm(64)) for _ in range(60)))


def model_b() -> nn.Module:
    """Few large parameters: Linear 1024 -> 2048 -> 2048 -> 10 (6 tensors, ~25 MB)."""
    return nn.Sequential(
        nn.Linear(1024, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 10)
    )


MODELS: dict[str, tuple[Callable[[], nn.Module], int, int]] = {  # builder, batch size, input width
    "A": (model_a, 256, 64),
    "B": (model_b, 64, 1024),
}


def make_step(method: str, model: nn.Module, cap_mb: float) -> Callable[[torch.Tensor, torch.Tensor], None]:
    """Build one training step (forward, backward, gradient reduction, SGD) for `method`."""
    world = dist.get_world_size()
    params = [p for p in model.parameters() if p.requires_grad]
    if method == "ours":
        reducer = Reducer(model, bucket_cap_mb=cap_mb)
        net: nn.Module = model
    elif method.startswith("torch_ddp"):  # torch's default copies grads; "_view" aliases them like ours
        view = method == "torch_ddp_view"
        reducer = None
        net = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=cap_mb, gradient_as_bucket_view=view)
    else:
        reducer, net = None, model
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    exposed_ms: list[float] = []  # per step: communication time not hidden behind backward

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        opt.zero_grad(set_to_none=True)
        if reducer is not None:
            reducer.sync_buffers()
        out = net(x)
        loss = F.mse_loss(out, y) if out.shape == y.shape else F.cross_entropy(out, y)
        if reducer is not None:
            reducer.prepare_for_backward(loss)
        loss.backward()
        if reducer is not None:
            reducer.finalize()
            exposed_ms.append(sum(s.wait_s for s in reducer.stats) * 1e3)
        elif method == "per_param":  # one blocking collective per tensor: latency-bound
            for p in params:
                dist.all_reduce(p.grad)
                p.grad.div_(world)
        elif method == "flat":  # one big collective, but only after backward: no overlap
            flat = torch.cat([p.grad.reshape(-1) for p in params])
            dist.all_reduce(flat)
            flat.div_(world)
            for p, g in zip(params, flat.split([p.numel() for p in params])):
                p.grad.copy_(g.view_as(p))
        opt.step()

    step.reducer, step.exposed_ms = reducer, exposed_ms  # type: ignore[attr-defined]
    return step


def batch_for(name: str, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed per-rank batch; targets match the model's output."""
    _, size, width = MODELS[name]
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(size, width, generator=g)
    y = torch.randn(size, 64, generator=g) if name == "A" else torch.randint(0, 10, (size,), generator=g)
    return x, y


def time_steps(step: Callable, x: torch.Tensor, y: torch.Tensor, warmup: int, n: int) -> list[float]:
    """Milliseconds per step after `warmup` untimed steps; ranks start together."""
    for _ in range(warmup):
        step(x, y)
    dist.barrier()
    times = []
    for _ in range(n):
        start = time.perf_counter()
        step(x, y)
        times.append((time.perf_counter() - start) * 1e3)
    return times


def timeline_step(step: Callable, x: torch.Tensor, y: torch.Tensor) -> dict:
    """One instrumented step of our reducer: backward span and each bucket's launch -> completion."""
    step(x, y)  # settle buffers after the rebuild
    reducer: Reducer = step.reducer  # type: ignore[attr-defined]
    model = reducer.module
    model.zero_grad(set_to_none=True)
    out = model(x)
    loss = F.mse_loss(out, y) if out.shape == y.shape else F.cross_entropy(out, y)
    reducer.prepare_for_backward(loss)
    start = time.perf_counter()  # ~ the reducer's time origin, which is set at the end of prepare
    completed: dict[int, float] = {}
    stop = threading.Event()

    def poll() -> None:  # instrumentation only: when did each all_reduce really finish (gloo)?
        while not stop.is_set():
            for b in reducer._layout.buckets:
                if b.work is not None and b.index not in completed and b.work.is_completed():
                    completed[b.index] = time.perf_counter() - start
            time.sleep(0.0002)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    loss.backward()
    backward_end = time.perf_counter() - start
    reducer.finalize()
    finalize_end = time.perf_counter() - start
    stop.set()
    poller.join()
    buckets = [
        {
            "index": s.index,
            "mb": s.nbytes / 2**20,
            "ready_s": s.ready_s,
            "launch_s": s.launch_s,
            "done_s": s.done_s,
            "completed_s": completed.get(s.index, s.done_s),
            "wait_s": s.wait_s,
        }
        for s in reducer.stats
    ]
    return {"backward_s": [0.0, backward_end], "finalize_end_s": finalize_end, "buckets": buckets}


def worker(rank: int, world: int, port: int, args: argparse.Namespace, out_path: str) -> None:
    """Run every configuration in lockstep on this rank; rank 0 writes the results."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    warmup, n, rounds = (1, 2, 1) if args.quick else (args.warmup, args.steps, args.rounds)
    results: dict = {
        "config": {"world_size": world, "warmup": warmup, "steps": n, "rounds": rounds},
        "models": {},
    }
    for name, (build, size, _width) in MODELS.items():
        x, y = batch_for(name, rank)
        configs = [(m, 25.0) for m in METHODS] + [("ours", mb) for mb in SWEEP_MB if mb != 25.0]
        steps = {}
        for method, mb in configs:
            torch.manual_seed(0)
            steps[(method, mb)] = make_step(method, build(), mb)
        for config in configs:  # first steps allocate, rebuild buckets, warm caches
            time_steps(steps[config], x, y, warmup, 0)
        times: dict[tuple[str, float], list[float]] = {c: [] for c in configs}
        for _ in range(rounds):  # short interleaved rounds: load from other processes hits every method
            for config in configs:
                times[config] += time_steps(steps[config], x, y, 1, n)
        reducer: Reducer = steps[("ours", 25.0)].reducer  # type: ignore[attr-defined]
        entry = {
            "batch": size,
            "params": sum(p.numel() for p in reducer.params),
            "tensors": len(reducer.params),
            "ms": {m: statistics.median(times[(m, 25.0)]) for m in METHODS},
            "sweep_ms": {str(mb): statistics.median(times[("ours", mb)]) for mb in SWEEP_MB},
            "buckets": len(reducer.bucket_indices),
            "exposed_comm_ms": statistics.median(steps[("ours", 25.0)].exposed_ms),  # type: ignore[attr-defined]
        }
        if args.timeline:  # at a small cap by default, so that several buckets (and overlap) show
            cap = args.timeline_cap_mb
            step = steps[("ours", cap)] if ("ours", cap) in steps else make_step("ours", build(), cap)
            entry["timeline"] = {"bucket_cap_mb": cap, **timeline_step(step, x, y)}
        results["models"][name] = entry
        dist.barrier()
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(results, f)
    dist.destroy_process_group()


def free_port() -> int:
    """A port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def print_table(results: dict) -> None:
    """Median ms/step per method and model, with the ratios that matter."""
    print(f"\nms per step (median), {results['config']}")
    print(f"{'model':<6}{'method':<15}{'ms/step':>10}{'vs torch_ddp':>14}")
    for name, entry in results["models"].items():
        ms = entry["ms"]
        for method in METHODS:
            print(f"{name:<6}{method:<15}{ms[method]:>10.1f}{ms[method] / ms['torch_ddp']:>13.2f}x")
        print(
            f"{name:<6}ours / torch_ddp = {ms['ours'] / ms['torch_ddp']:.2f}x   "
            f"ours / torch_ddp_view = {ms['ours'] / ms['torch_ddp_view']:.2f}x   "
            f"per_param / ours = {ms['per_param'] / ms['ours']:.1f}x"
        )
        sweep = "  ".join(f"{mb}MB: {t:.1f}" for mb, t in entry["sweep_ms"].items())
        print(f"{name:<6}bucket_cap_mb sweep (ours, ms/step)  {sweep}")
        hidden = f"comm not hidden by backward (median): {entry['exposed_comm_ms']:.1f} ms"
        print(f"{name:<6}{entry['buckets']} bucket(s) at 25 MB; {hidden}\n")


def plot_timeline(results: dict, path: str) -> None:
    """Draw each model's instrumented step: backward span and every bucket's all_reduce."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: skipping the timeline plot (the data is in ddp.json)")
        return
    rows = [len(entry["timeline"]["buckets"]) + 1 for entry in results["models"].values()]
    fig, axes = plt.subplots(
        len(rows), 1, figsize=(11, 1.5 * len(rows) + 0.2 * sum(rows)), squeeze=False, height_ratios=rows
    )
    for ax, (name, entry) in zip(axes[:, 0], results["models"].items()):
        tl = entry["timeline"]
        ax.barh(0, (tl["backward_s"][1]) * 1e3, left=0, color="tab:blue", label="backward compute")
        for k, b in enumerate(tl["buckets"], start=1):
            done = b["completed_s"]
            ax.barh(k, (done - b["launch_s"]) * 1e3, left=b["launch_s"] * 1e3, color="tab:orange")
            ax.plot([b["ready_s"] * 1e3, b["done_s"] * 1e3], [k, k], "k|")
        ax.set_yticks(
            range(len(tl["buckets"]) + 1), ["backward"] + [f"bucket {b['index']}" for b in tl["buckets"]]
        )
        ax.invert_yaxis()
        ax.set_title(
            f"model {name}, bucket_cap_mb={tl['bucket_cap_mb']}: all_reduce per bucket "
            "(launch -> completed); | = last grad ready, wait() returned"
        )
        ax.set_xlabel("ms since prepare_for_backward")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


def main() -> None:
    """Parse arguments, run the two ranks, print and save the results."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="few steps, one round: a smoke run")
    parser.add_argument("--timeline", action="store_true", help="write benchmarks/results/ddp_timeline.png")
    parser.add_argument("--timeline-cap-mb", type=float, default=0.05, help="bucket cap of the plotted step")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per method before timing")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per method per round")
    parser.add_argument("--rounds", type=int, default=8, help="interleaved rounds over all methods")
    args = parser.parse_args()
    os.makedirs(RESULTS, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        out_path = os.path.join(tmp, "ddp.json")
        mp.spawn(worker, args=(2, free_port(), args, out_path), nprocs=2, join=True)
        with open(out_path) as f:
            results = json.load(f)
    print_table(results)
    with open(os.path.join(RESULTS, "ddp.json"), "w") as f:
        json.dump(results, f, indent=2)
    print(f"wrote {os.path.join(RESULTS, 'ddp.json')}")
    if args.timeline:
        plot_timeline(results, os.path.join(RESULTS, "ddp_timeline.png"))


if __name__ == "__main__":
    main()
