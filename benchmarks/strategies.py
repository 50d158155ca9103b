"""Side-by-side strategy benchmark: samples/second of single, dp (2 replicas) and ddp (2 processes) on the same
model and global batch, through the Trainer, on the CPU; plus where a dp step spends its time (replication).

Every contender runs in its own fresh process(es) (ddp: two gloo processes on 127.0.0.1), interleaved in
rounds, so the ratios are comparable on a noisy machine. Samples/second is the global batch over the median
step time of a run (other work on the machine only slows steps down), and the median over rounds is reported.

    python benchmarks/strategies.py            # full run, writes benchmarks/results/strategies.json
    python benchmarks/strategies.py --quick    # a fast smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# First, even when PYTHONPATH has it: benchmarks/ (sys.path[0] for a script) holds a strategies.py.
sys.path.insert(0, ROOT)

RESULTS = os.path.join(ROOT, "benchmarks", "results")
_RANK_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def model_a() -> nn.Module:
    """Many small layers: 24 x [Linear 128x128 + LayerNorm + ReLU] (~0.4M parameters, 98 tensors)."""
    return nn.Sequential(
        *(nn.Sequential(nn.Linear(128, 128), nn.LayerNorm(128), nn.ReLU()) for _ in range(24)),
        nn.Linear(128, 10),
    )


def model_b() -> nn.Module:
    """Few large layers: Linear 1024 -> 2048 -> 2048 -> 10 (~6.3M parameters, 6 tensors)."""
    return nn.Sequential(
        nn.Linear(1024, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 10)
    )


# name -> (builder, global batch, input width, measured steps)
MODELS: dict[str, tuple[Callable[[], nn.Module], int, int, int]] = {
    "A": (model_a, 256, 128, 60),
    "B": (model_b, 256, 1024, 16),
}
# name -> (strategy, devices or processes, torch intra-op threads per process)
CONTENDERS: dict[str, tuple[str, int, int]] = {
    "single-1t": ("single", 1, 1),
    "single": ("single", 1, 2),
    "dp": ("dp", 2, 1),
    "dp-2t": ("dp", 2, 2),
    "dp-seq": ("dp", 2, 1),  # deterministic=True: the 2 replicas one after another, what threads save
    "ddp": ("ddp", 2, 1),
}
WARMUP = 4


# ----- one contender, inside its worker process --------------------------------------------------------------
def _worker(contender: str, model: str, steps: int) -> dict[str, Any]:
    from callbacks.base import Callback
    from trainer import Task, Trainer, seed_everything

    strategy, devices, threads = CONTENDERS[contender]
    builder, batch, width, _ = MODELS[model]
    torch.set_num_threads(threads)
    world = devices if strategy == "ddp" else 1

    class Bench(Task):
        def __init__(self) -> None:
            super().__init__()
            self.net = builder()

        def training_step(self, b: Any, batch_idx: int) -> torch.Tensor:
            x, y = b
            loss = F.cross_entropy(self.net(x), y)
            self.log("train/loss", loss)
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    class StepTimer(Callback):
        """The time of each step from step `first` (the warm-up excluded) to the end of step `last`."""

        def __init__(self, first: int, last: int) -> None:
            self.first, self.last, self.marks = first, last, []

        def on_train_batch_start(self, trainer: Any, task: Any, b: Any, batch_idx: int) -> None:
            if batch_idx == self.first and hasattr(trainer.strategy, "stats"):
                trainer.strategy.stats.update(dict.fromkeys(trainer.strategy.stats, 0))
            if batch_idx >= self.first:
                self.marks.append(time.perf_counter())

        def on_train_batch_end(self, trainer: Any, task: Any, out: Any, b: Any, batch_idx: int) -> None:
            if batch_idx == self.last:
                self.marks.append(time.perf_counter())

    seed_everything(0)
    task = Bench()
    n = batch * (WARMUP + steps)
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(
        torch.randn(n, width, generator=g), torch.randint(0, 10, (n,), generator=g)
    )
    timer = StepTimer(WARMUP, WARMUP + steps - 1)
    trainer = Trainer(
        strategy=strategy, devices=devices, accelerator="cpu", max_steps=WARMUP + steps, max_epochs=1,
        num_sanity_val_steps=0, logger=False, enable_progress_bar=False, enable_checkpointing=False,
        enable_model_summary=False, callbacks=[timer], deterministic=True if contender == "dp-seq" else None,
    )  # fmt: skip
    trainer.fit(task, torch.utils.data.DataLoader(data, batch_size=batch // world))
    seconds = timer.marks[-1] - timer.marks[0]
    step_s = [b - a for a, b in zip(timer.marks, timer.marks[1:])]
    # the median step resists other work on the machine, which only ever slows steps down
    result: dict[str, Any] = {"seconds": seconds, "median_step_s": statistics.median(step_s)}
    stats = getattr(trainer.strategy, "stats", None)
    if stats:
        per = {k[:-2] + "_ms": 1000 * v / stats["steps"] for k, v in stats.items() if k.endswith("_s")}
        per["step_ms"] = 1000 * seconds / steps
        params = [p for p in task.parameters()]
        t0 = time.perf_counter()
        for _ in range(10):
            [p.detach().clone() for p in params]
        per["copy_params_ms"] = 100 * (time.perf_counter() - t0)  # the memory copy alone, 10 times
        per["param_mb"] = sum(p.numel() * p.element_size() for p in params) / 2**20
        result["dp"] = per
    return result


# ----- the driver ----------------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(contender: str, model: str, steps: int) -> dict[str, Any]:
    """Run one contender in fresh process(es); ddp gets two ranks wired like torchrun would."""
    env = {k: v for k, v in os.environ.items() if k not in _RANK_VARS}
    env["PYTHONUNBUFFERED"] = "1"
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--worker",
        contender,
        "--model",
        model,
        "--steps",
        str(steps),
    ]
    strategy, devices, _ = CONTENDERS[contender]
    ranks = devices if strategy == "ddp" else 1
    port = str(_free_port())
    procs = []
    for r in range(ranks):
        rank_env = dict(env)
        if strategy == "ddp":
            rank_env.update(RANK=str(r), WORLD_SIZE=str(ranks), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(ranks),
                            MASTER_ADDR="127.0.0.1", MASTER_PORT=port)  # fmt: skip
        procs.append(
            subprocess.Popen(cmd, env=rank_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        )
    outs = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=600)
        if p.returncode != 0:
            raise RuntimeError(f"{contender} on model {model} failed:\n{stderr[-3000:]}")
        outs.append(json.loads(next(line for line in stdout.splitlines() if line.startswith("RESULT "))[7:]))
    result = outs[0]
    step = max(o["median_step_s"] for o in outs)  # the slowest rank sets the pace
    seconds = max(o["seconds"] for o in outs)
    batch = MODELS[model][1]
    result.update(
        seconds=seconds,
        median_step_s=step,
        samples_per_s=batch / step,
        window_samples_per_s=batch * steps / seconds,
    )
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer steps and one round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--models", default="A,B")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--steps", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        print("RESULT " + json.dumps(_worker(args.worker, args.model, args.steps)), flush=True)
        return
    rounds = 1 if args.quick else args.rounds
    load = os.getloadavg()
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for model in args.models.split(","):
        steps = max(MODELS[model][3] // (4 if args.quick else 1), 3)
        runs[model] = {c: [] for c in CONTENDERS}
        for r in range(rounds):
            for c in CONTENDERS:
                runs[model][c].append(_launch(c, model, steps))
                print(f"  model {model} round {r + 1}/{rounds} {c:>9}: "
                      f"{runs[model][c][-1]['samples_per_s']:9.0f} samples/s", file=sys.stderr)  # fmt: skip
    report = summarize(runs, rounds, load)
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "strategies.json"), "w") as f:
        json.dump(report, f, indent=2)
    print_table(report)


def summarize(
    runs: dict[str, dict[str, list[dict[str, Any]]]], rounds: int, load: tuple[float, ...]
) -> dict[str, Any]:
    models: dict[str, Any] = {}
    for model, by_contender in runs.items():
        median = {c: statistics.median(r["samples_per_s"] for r in rs) for c, rs in by_contender.items()}
        breakdown = {
            v: {k: statistics.median(r["dp"][k] for r in by_contender[v]) for k in by_contender[v][0]["dp"]}
            for v in ("dp", "dp-2t", "dp-seq")
        }
        models[model] = {
            "description": MODELS[model][0].__doc__,
            "global_batch": MODELS[model][1],
            "samples_per_s": median,
            "vs_single": {c: v / median["single"] for c, v in median.items()},
            "ddp_over_dp": median["ddp"] / max(median["dp"], median["dp-2t"], median["dp-seq"]),
            "dp_breakdown_ms": breakdown,
            "runs": by_contender,
        }
    return {
        "benchmark": "strategies",
        "machine": {
            "cpu_cores": os.cpu_count(),
            "torch": torch.__version__,
            "python": sys.version.split()[0],
            "load_average_1m": {"start": load[0], "end": os.getloadavg()[0]},  # other work on the machine
        },
        "rounds": rounds,
        "warmup_steps": WARMUP,
        "contenders": {
            c: {"strategy": s, "devices": d, "threads_per_process": t} for c, (s, d, t) in CONTENDERS.items()
        },
        "models": models,
    }


def print_table(report: dict[str, Any]) -> None:
    lo = report["machine"]["load_average_1m"]
    print(
        f"\nSamples/second, median of {report['rounds']} round(s), global batch / median step time (higher is better);"
    )
    print(f"load average (1 min) of the machine: {lo['start']:.1f} at the start, {lo['end']:.1f} at the end")
    print(f"{'model':<6}{'contender':<11}{'samples/s':>11}{'vs single':>11}")
    for model, m in report["models"].items():
        for c, v in m["samples_per_s"].items():
            print(f"{model:<6}{c:<11}{v:>11.0f}{m['vs_single'][c]:>10.2f}x")
        print(f"{model:<6}{'ddp / best dp':<22}{m['ddp_over_dp']:>10.2f}x")
    print(
        "\ndp step breakdown, ms per step (median): scatter, replicate, forward in threads, merge + gather,"
    )
    print("backward (replicas in threads), replication as % of the step, a bare copy of the parameters")
    print(f"{'model':<6}{'variant':<8}{'step':>8}{'scatter':>9}{'replic.':>9}{'forward':>9}{'gather':>9}"
          f"{'backward':>10}{'replic.%':>10}{'copy only':>11}{'params MB':>11}")  # fmt: skip
    for model, m in report["models"].items():
        for variant, b in m["dp_breakdown_ms"].items():
            print(
                f"{model:<6}{variant:<8}{b['step_ms']:>8.2f}{b['scatter_ms']:>9.2f}{b['replicate_ms']:>9.2f}"
                f"{b['parallel_ms']:>9.2f}{b['gather_ms']:>9.2f}{b['backward_ms']:>10.2f}"
                f"{100 * b['replicate_ms'] / b['step_ms']:>9.1f}%"
                f"{b['copy_params_ms']:>11.2f}{b['param_mb']:>11.1f}"
            )


if __name__ == "__main__":
    main()
