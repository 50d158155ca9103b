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
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # first: benchmarks/ (a script's sys.path[0]) holds a strategies.py

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from strategies.costmodel import LinkCost, best_layout, buckets_for_cap, predict, sweep_caps  # noqa: E402
from strategies.reducer import AUTO_ITERATIONS, TRIAL_ITERATIONS, Reducer  # noqa: E402

RESULTS = os.path.join(ROOT, "benchmarks", "results", "cluster.json")
PLOT = os.path.join(ROOT, "docs", "img", "cluster_costmodel.png")
RATES = ("unlimited", "1gbit", "300mbit", "100mbit")
METHODS = ("tandem_auto", "tandem_cap25", "torch_ddp", "flat", "no_comm")
AGAIN = "tandem_cap25_again"  # --aa: a second copy of cap 25, whose ratio to the first is the noise floor
PORT = 29517
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
            argv = [
                sys.executable,
                __file__,
                "--worker",
                *(["--aa"] if aa else []),
                "--models",
                *models,
                "--steps",
                str(steps),
                "--out",
                out_path,
            ]
            procs.append(lab.popen(node, argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
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


def _cost(a: dict) -> LinkCost:
    """The cost model auto fitted (older result files have no CPU share: none)."""
    cpu = (a.get("cpu_alpha_s", 0.0), a.get("cpu_beta_s", 0.0), a.get("compute_rate", 1.0))
    return LinkCost(a["alpha_s"], a["beta_s"], *cpu)


def summarise(results: dict) -> list[dict]:
    """One row per (rate, model): ms/step per method, gains, and the cost model's prediction."""
    rows = []
    for rate, by_model in results.items():
        for name, m in by_model.items():
            nc, flat, auto = m["no_comm"], m["flat"], m["tandem_auto"]
            a = auto.get("auto")
            ideal = nc["forward"] + max(nc["backward"] + nc["optim"], flat["allreduce"])
            row = {"rate": rate, "model": name, **{k: m[k]["step"] for k in METHODS}}
            row.update(
                allreduce_ms=flat["allreduce"],
                gain_auto=flat["step"] / auto["step"],
                gain_cap25=flat["step"] / m["tandem_cap25"]["step"],
                gain_ideal=flat["step"] / ideal,
                auto_vs_cap25=auto["step"] / m["tandem_cap25"]["step"],
                again_vs_cap25=m[AGAIN]["step"] / m["tandem_cap25"]["step"] if AGAIN in m else None,
                auto_buckets_mb=auto.get("bucket_mb"),
            )
            if a is not None:
                # the layout auto ended with: its choice, or the 25 MB one (kept, or back after the trial)
                in_use = a[
                    "predicted_step_s_cap25" if a["kept_cap25"] or a.get("reverted") else "predicted_step_s"
                ]
                row.update(
                    predicted_auto=1e3 * in_use,
                    predicted_cap25=1e3 * a["predicted_step_s_cap25"],
                    predicted_choice=1e3 * a["predicted_step_s"],
                    trial="-" if a["kept_cap25"] else ("reverted" if a.get("reverted") else "kept"),
                    cpu_share_ms=[1e3 * v for v in a.get("probes_cpu_s", {}).values()],
                    compute_rate=a.get("compute_rate", 1.0),
                    error_auto=1e3 * in_use / auto["step"] - 1,
                    error_cap25=1e3 * a["predicted_step_s_cap25"] / m["tandem_cap25"]["step"] - 1,
                    alpha_us=1e6 * a["alpha_s"],
                    mb_per_s=1 / a["beta_s"] / 1e6 if a["beta_s"] else float("inf"),
                )
            rows.append(row)
    return rows


def print_table(rows: list[dict]) -> None:
    head = "| rate | model | auto | cap 25 | torch DDP | flat | no comm | auto/25 | gain auto | gain 25 | ideal | pred auto (err) | pred 25 (err) | trial | auto buckets MB |"
    if rows and rows[0].get("again_vs_cap25") is not None:
        head += " A/A |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for r in rows:
        pred = [
            f"{r[p]:.1f} ({100 * r[e]:+.0f}%)" if p in r else "-"
            for p, e in (("predicted_auto", "error_auto"), ("predicted_cap25", "error_cap25"))
        ]
        buckets = ", ".join(f"{mb:.2f}" for mb in r["auto_buckets_mb"] or [])
        print(
            f"| {r['rate']} | {r['model']} | {r['tandem_auto']:.1f} | {r['tandem_cap25']:.1f} | {r['torch_ddp']:.1f} |"
            f" {r['flat']:.1f} | {r['no_comm']:.1f} | {r['auto_vs_cap25']:.3f} | {r['gain_auto']:.2f} |"
            f" {r['gain_cap25']:.2f} | {r['gain_ideal']:.2f} | {pred[0]} | {pred[1]} | {r.get('trial', '-')} | {buckets} |"
            + (f" {r['again_vs_cap25']:.3f} |" if r.get("again_vs_cap25") is not None else "")
        )


def curves(results: dict) -> dict:
    """Predicted step time (ms) vs bucket cap and vs world size, from each run's measured numbers."""
    caps, worlds = [0.01, 0.03, 0.1, 0.3, 1, 3, 10, 25, 100], [2, 4, 8, 16, 32, 64, 128, 256]
    out: dict = {"caps_mb": caps, "world_sizes": worlds, "by_cap": {}, "by_world": {}}
    for rate, by_model in results.items():
        for name, m in by_model.items():
            a = m["tandem_auto"].get("auto")
            if a is None:
                continue
            ready, sizes, cost = a["ready_s"], m["tandem_auto"]["sizes"], _cost(a)
            order = [i for b in a["buckets"] for i in b]
            key = f"{rate}/{name}"
            sweep = sweep_caps(ready, sizes, order, cost, 2, caps, forward_s=a["outside_s"])
            out["by_cap"][key] = [1e3 * p.step_s for _, p in sweep]
            by_world = {"auto": [], "cap25": []}
            for p in worlds:
                for label, buckets in (
                    ("auto", best_layout(ready, sizes, order, cost, p, None, a["outside_s"])),
                    ("cap25", buckets_for_cap(sizes, order, 25.0)),
                ):
                    by_world[label].append(
                        1e3 * predict(ready, sizes, buckets, cost, p, a["outside_s"]).step_s
                    )
            out["by_world"][key] = by_world
    return out


def plot(c: dict) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install matplotlib, or `make bench`)")
        return
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    colors = {name: f"C{k}" for k, name in enumerate(MODELS)}
    styles = dict(zip(RATES, ("-", "--", "-.", ":")))
    at25 = c["caps_mb"].index(25)
    for key, ys in c["by_cap"].items():
        rate, name = key.split("/")
        rel = [y / ys[at25] for y in ys]  # relative to 25 MB buckets: the shape, whatever the step's length
        left.plot(c["caps_mb"], rel, marker="o", ms=3, ls=styles[rate], color=colors[name], label=key)
    left.set(
        xscale="log",
        xlabel="bucket cap (MB)",
        ylabel="predicted step / step with 25 MB buckets",
        title="vs bucket size (2 ranks; tiny caps reach 4.5x, off the scale)",
        ylim=(0.85, 1.5),
    )
    for key, ys in c["by_world"].items():
        rate, name = key.split("/")
        right.plot(
            c["world_sizes"], ys["auto"], marker="o", ms=3, ls=styles[rate], color=colors[name], label=key
        )
        right.plot(
            c["world_sizes"], ys["cap25"], marker="x", ms=4, ls=styles[rate], color=colors[name], alpha=0.4
        )
    right.set(
        xscale="log",
        yscale="log",
        xlabel="ranks",
        ylabel="predicted ms/step",
        title="vs world size (o: best layout, x faint: 25 MB buckets)",
    )
    left.legend(fontsize=6)
    right.legend(fontsize=6)
    fig.tight_layout()
    os.makedirs(os.path.dirname(PLOT), exist_ok=True)
    fig.savefig(PLOT, dpi=110)
    print(f"plot: {PLOT}")


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
