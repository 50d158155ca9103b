"""torch.compile: eager against compiled steps through the Trainer, and DDP's overlap under compile.

    python benchmarks/compile.py local           # one process: a small transformer and a convnet, eager vs compiled
    sudo python benchmarks/compile.py lab        # two lab nodes at 1gbit and 300mbit, compile on for all but `eager`

local: Tandem eager and compiled (a Trainer each: same task class, same batches, logger and bars off) and
a raw PyTorch loop eager and compiled (so that torch's own gain shows beside ours) take turns in blocks of
BLOCK steps, in a rotated order, on one process; a Trainer step's time is the gap between two
on_train_batch_start calls (the whole loop, not just the model), the first of each block untimed; the
compiled ones compile before timing. A ratio is the median over rounds of compiled / eager.

lab: one gloo worker per node of benchmarks/lab.py (one torch thread each), the same model and batches:
  eager      our Reducer, no compile (the reference)
  split      our Reducer + compile, the graph split at the bucket size (what DDPStrategy does under compile)
  whole      our Reducer + compile as one graph: every bucket becomes ready at the end of backward
  flat       compile, then one all-reduce of all gradients after backward
  torch_ddp  torch's DistributedDataParallel + torch.compile (its own DDPOptimizer), same bucket cap
Steps alternate between the methods in rotated blocks (cluster.py's rule). Writes benchmarks/results/compile.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import types
from collections.abc import Callable
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # first: benchmarks/ (a script's sys.path[0]) holds a strategies.py

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

RESULTS = os.path.join(ROOT, "benchmarks", "results", "compile.json")
BLOCK = 6  # steps per contender turn; the first is not timed
LAB_METHODS = ("eager", "split", "whole", "flat", "torch_ddp")
LAB_WIDTH, LAB_DEPTH, LAB_BATCH, LAB_CAP_MB = 1024, 6, 256, 4.0  # 25 MB of weights in about 7 buckets


# ----- models -------------------------------------------------------------------------------------
class TinyTransformer(nn.Module):
    """Next-token model: embedding 1000x128, 2 encoder layers (4 heads, FF 256), a 1000-way head; seq 64."""

    batch = 16

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(1000, 128)
        layer = nn.TransformerEncoderLayer(128, 4, 256, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(128, 1000)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.enc(self.emb(x)))

    @staticmethod
    def make_batch(g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randint(0, 1000, (16, 65), generator=g)
        return x[:, :-1], x[:, 1:]


class ConvNet(nn.Module):
    """Three 3x3 convolutions (32, 64, 64 channels, two with stride 2), pooling, a 10-way head; 32x32 RGB."""

    batch = 32

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=2, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        )  # fmt: skip
        self.head = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))

    @staticmethod
    def make_batch(g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(32, 3, 32, 32, generator=g), torch.randint(0, 10, (32,), generator=g)


LOCAL_MODELS: dict[str, type[nn.Module]] = {"transformer": TinyTransformer, "convnet": ConvNet}


def _loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


# ----- local: through the Trainer -----------------------------------------------------------------
def _local(name: str, rounds: int) -> dict[str, Any]:
    from callbacks import Callback
    from trainer import Task, Trainer

    model_cls = LOCAL_MODELS[name]

    class Bench(Task):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.model = model_cls()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.model(x)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            loss = _loss(self(x), y)
            self.log("train/loss", loss)
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=1e-3)

    class Clock(Callback):
        def __init__(self) -> None:
            self.stamps: list[float] = []

        def on_train_batch_start(self, trainer: Any, task: Any, batch: Any, batch_idx: int) -> None:
            self.stamps.append(time.perf_counter())

    g = torch.Generator().manual_seed(0)
    batches = [model_cls.make_batch(g) for _ in range(BLOCK + 1)]
    tasks = {"tandem": Bench(), "tandem_compiled": Bench()}
    quiet = dict(
        logger=False, enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False
    )

    def tandem(kind: str) -> list[float]:
        clock = Clock()
        compile_on = kind == "tandem_compiled"
        trainer = Trainer(
            accelerator="cpu", max_steps=BLOCK + 1, compile=compile_on, callbacks=[clock], **quiet
        )
        trainer.fit(tasks[kind], batches)
        return [b - a for a, b in zip(clock.stamps[1:], clock.stamps[2:])]  # the block's first step untimed

    raw_models = {k: model_cls() for k in ("raw", "raw_compiled")}
    raw_fns = {"raw": raw_models["raw"], "raw_compiled": torch.compile(raw_models["raw_compiled"])}
    raw_opts = {k: torch.optim.SGD(m.parameters(), lr=1e-3) for k, m in raw_models.items()}

    def raw(kind: str) -> list[float]:
        stamps = []
        for x, y in batches:
            stamps.append(time.perf_counter())
            loss = _loss(raw_fns[kind](x), y)
            loss.backward()
            raw_opts[kind].step()
            raw_opts[kind].zero_grad()
        stamps.append(time.perf_counter())
        return [b - a for a, b in zip(stamps[1:], stamps[2:])]

    run = {"tandem": tandem, "tandem_compiled": tandem, "raw": raw, "raw_compiled": raw}
    kinds = list(run)
    t = time.perf_counter()
    tandem("tandem_compiled")  # compiles
    compile_s = time.perf_counter() - t
    for kind in kinds:
        run[kind](kind)
    times: dict[str, list[float]] = {k: [] for k in kinds}
    for r in range(rounds):
        for kind in kinds[r % len(kinds) :] + kinds[: r % len(kinds)]:
            times[kind].append(statistics.median(run[kind](kind)))
    ratio = {
        "tandem": [c / e for c, e in zip(times["tandem_compiled"], times["tandem"])],
        "raw": [c / e for c, e in zip(times["raw_compiled"], times["raw"])],
    }
    return {
        **{f"{k}_ms": 1e3 * statistics.median(v) for k, v in times.items()},
        "ratio": statistics.median(ratio["tandem"]),
        "ratio_iqr": _iqr(ratio["tandem"]),
        "raw_ratio": statistics.median(ratio["raw"]),
        "compile_s": compile_s,
    }


def _print_local(out: dict[str, dict[str, Any]]) -> None:
    print(f"{'model':12s} {'eager ms':>9s} {'compiled ms':>12s} {'compiled/eager':>15s} {'IQR':>13s}", end="")
    print(f" {'raw torch: compiled/eager':>26s} {'compile s':>10s}")
    for name, r in out.items():
        iqr = f"{r['ratio_iqr'][0]:.3f}-{r['ratio_iqr'][1]:.3f}"
        print(
            f"{name:12s} {r['tandem_ms']:9.2f} {r['tandem_compiled_ms']:12.2f} {r['ratio']:15.3f} {iqr:>13s}",
            end="",
        )
        print(f" {r['raw_ratio']:26.3f} {r['compile_s']:10.1f}")


def _iqr(values: list[float]) -> list[float]:
    q = statistics.quantiles(values, n=4) if len(values) > 1 else values * 3
    return [q[0], q[-1]]


# ----- lab: two nodes, DDP under compile ----------------------------------------------------------
def _lab_method(method: str) -> Callable[[], None]:
    import torch.distributed as dist

    from strategies.compiled import BucketSplits
    from strategies.reducer import Reducer

    torch.manual_seed(0)
    layers = [m for _ in range(LAB_DEPTH) for m in (nn.Linear(LAB_WIDTH, LAB_WIDTH), nn.Tanh())]
    model = _own_sequential(method)(*layers, nn.Linear(LAB_WIDTH, 10))
    g = torch.Generator().manual_seed(dist.get_rank())
    x, y = torch.randn(LAB_BATCH, LAB_WIDTH, generator=g), torch.randint(0, 10, (LAB_BATCH,), generator=g)
    reducer = Reducer(model, bucket_cap_mb=LAB_CAP_MB) if method in ("eager", "split", "whole") else None
    net: nn.Module = model
    if method == "torch_ddp":
        net = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=LAB_CAP_MB)
    if method != "eager":
        net = torch.compile(net)
    scope = BucketSplits(reducer.bucket_bytes_cap) if method == "split" and reducer else None
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    params = list(model.parameters())

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        if scope is not None:
            scope.__enter__()
        try:
            loss = F.cross_entropy(net(x), y)
        finally:
            if scope is not None:
                scope.__exit__(None, None, None)
        if reducer is not None:
            reducer.prepare_for_backward(loss)
        loss.backward()
        if reducer is not None:
            reducer.finalize()
        if method == "flat":
            flat = torch.cat([p.grad.reshape(-1) for p in params])
            dist.all_reduce(flat)
            flat /= dist.get_world_size()
            for p, part in zip(params, flat.split([p.numel() for p in params])):
                p.grad.copy_(part.view_as(p))
        opt.step()

    return step


def _own_sequential(tag: str) -> type[nn.Sequential]:
    """nn.Sequential with a forward of its own code object: dynamo caches compiled graphs per code object,
    so methods sharing Sequential.forward would run each other's graphs (split or not)."""
    base = nn.Sequential.forward
    code = base.__code__.replace(co_name=f"forward_{tag}")
    forward = types.FunctionType(code, base.__globals__, f"forward_{tag}")
    return type(f"Sequential_{tag}", (nn.Sequential,), {"forward": forward})


def lab_worker(steps: int, out_path: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    runs = {m: _lab_method(m) for m in LAB_METHODS}
    for step in runs.values():  # warm-up: compiles, and the Reducer's bucket rebuild
        for _ in range(3):
            step()
    times: dict[str, list[float]] = {m: [] for m in LAB_METHODS}
    for r in range(-(-steps // (BLOCK - 1))):
        for method in LAB_METHODS[r % len(LAB_METHODS) :] + LAB_METHODS[: r % len(LAB_METHODS)]:
            runs[method]()  # the block's first step is not timed
            for _ in range(BLOCK - 1):
                dist.barrier()
                t = time.perf_counter()
                runs[method]()
                times[method].append(time.perf_counter() - t)
    if dist.get_rank() == 0:
        with open(out_path, "w") as f:
            json.dump({m: 1e3 * statistics.median(v) for m, v in times.items()}, f)
    dist.barrier()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=("local", "lab"))
    p.add_argument("--rounds", type=int, default=15, help="local: blocks per contender")
    p.add_argument("--threads", type=int, default=1, help="local: torch threads")
    p.add_argument("--rates", nargs="+", default=["1gbit", "300mbit"])
    p.add_argument("--steps", type=int, default=20, help="lab: timed steps per method")
    p.add_argument("--results", default=RESULTS)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        lab_worker(args.steps, args.out)
        return 0
    results = _read(args.results)
    # a cache of our own, empty (and removed after): `compile s` is a cold compile, not a read of an earlier
    # run's kernels; the lab's workers inherit it
    with tempfile.TemporaryDirectory(prefix="tandem-compile-bench-") as cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
        if not _run(args, results):
            return 0
    os.makedirs(os.path.dirname(os.path.abspath(args.results)), exist_ok=True)
    with open(args.results, "w") as f:
        json.dump(results, f, indent=1)
    print(f"wrote {args.results}")
    return 0


def _run(args: argparse.Namespace, results: dict[str, Any]) -> bool:
    """Run the mode asked for into `results`; False when the lab cannot be built here."""
    if args.mode == "local":
        torch.set_num_threads(args.threads)
        out = {name: _local(name, args.rounds) for name in LOCAL_MODELS}
        _print_local(out)
        results["local"] = {"threads": args.threads, "rounds": args.rounds, "models": out, "at": time.time()}
    else:
        from benchmarks.lab import unavailable
        from benchmarks.lab_run import run_two_node

        reason = unavailable()
        if reason:
            print(f"skipped: {reason}")
            return False
        lab = {}
        for rate in args.rates:
            lab[rate] = run_two_node(
                rate, [sys.executable, __file__, "lab", "--worker", "--steps", str(args.steps)], 1800
            )
            row = lab[rate]
            ratios = "  ".join(f"{m} {row[m] / row['split']:.3f}" for m in LAB_METHODS if m != "split")
            print(
                f"{rate}: ms/step "
                + "  ".join(f"{m} {v:.1f}" for m, v in row.items())
                + f"   x split: {ratios}"
            )
        results["lab"] = {"steps": args.steps, "rates": lab, "at": time.time()}
    return True


def _read(path: str) -> dict[str, Any]:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


if __name__ == "__main__":
    sys.exit(main())
