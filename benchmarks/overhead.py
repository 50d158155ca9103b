"""Per-step overhead of Tandem against a raw PyTorch loop (and PyTorch Lightning when installed).

    python benchmarks/overhead.py            # 3 runs x 15 rounds; writes benchmarks/results/overhead.json
    python benchmarks/overhead.py --quick    # 1 run x 5 rounds (about a minute)

How it measures. Every contender trains the same model on the same synthetic batches, in its own thread,
for one long epoch. A baton lets exactly one contender run at a time: it runs `window` training steps,
then hands the baton to the next contender. The clock sits in the dataset's ``__getitem__`` (the same
instrumentation for every contender, and the loaders stay plain DataLoaders), so one window is the time
between fetching batch i and batch i + window: `window` whole loop iterations, whatever the framework
does around the step. After a warm-up turn, the contenders take turns for `rounds` rounds, in a new
random order each round; a contender's ratio to the raw loop is the median over rounds of
(its window / the raw loop's window in the same round), so machine noise that lasts longer than a round
cancels. The whole measurement is repeated in `runs` independent runs (fresh threads, models and
trainers) and the median is taken over the rounds of all runs: identical contenders differ by a percent
or two from one set of instances to the next (memory placement), and the `raw-again` control row shows
how well that cancels.

Each window is timed twice: wall clock, and the process's CPU time (all its threads, so the TensorBoard
writer's thread counts; time taken from us by other processes does not), the steadier of the two on a
shared machine. The window (50 steps) is a multiple of log_every_n_steps, so each window holds exactly
one logging step. Epoch-end work (checkpointing) falls outside the timed windows: this is the per-step
cost.

Models: Lightning's parity models (`lstm`: LSTM 10->20 + Linear 20->5, sequences of 100, batch 30;
`mlp`: 784->128, tanh, BatchNorm, dropout, ->10, batch 128) and `tiny` (Linear 16->1, batch 8), whose step
costs almost nothing, so that the framework's fixed cost per step shows.

Contenders:
  raw                 a hand-written loop: forward, loss, backward, step, zero_grad
  raw-again           the same loop again, as a control: its ratio to `raw` should be 1.000
  tandem              Trainer(logger=False, progress bar, checkpointing and model summary off)
  tandem-defaults     Trainer() defaults: TensorBoard logger, progress bar, checkpointing (into a temp dir)
  lightning           pytorch_lightning.Trainer with the same settings as `tandem` (when installed)
  lightning-defaults  pytorch_lightning.Trainer() defaults (when installed)
Both frameworks' tasks call self.log("train/loss", loss, prog_bar=True) every step; the raw loop logs nothing.
Progress bars draw into /dev/null (the formatting work is still done); --show-bars draws them.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import logging
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

TARGETS = {"tandem": 1.03, "tandem-defaults": 1.10}
IMPORT_TARGET_S = 0.3


# ----- the models: PyTorch Lightning's parity-benchmark models, written out here ------------------------
class LSTMNet(torch.nn.Module):
    """LSTM 10 -> 20 over sequences of 100 steps, then Linear 20 -> 5 at every step; MSE loss."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn = torch.nn.LSTM(10, 20, batch_first=True)
        self.head = torch.nn.Linear(20, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(x)[0])

    @staticmethod
    def loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(out, y)

    @staticmethod
    def batch(g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(30, 100, 10, generator=g), torch.randn(30, 100, 5, generator=g)


class MLPNet(torch.nn.Module):
    """784 -> 128, tanh, BatchNorm, dropout, -> 10; cross-entropy loss."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(784, 128),
            torch.nn.Tanh(),
            torch.nn.BatchNorm1d(128),
            torch.nn.Dropout(0.3),
            torch.nn.Linear(128, 10),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    @staticmethod
    def loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(out, y)

    @staticmethod
    def batch(g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(128, 784, generator=g), torch.randint(0, 10, (128,), generator=g)


class TinyNet(torch.nn.Module):
    """Linear 16 -> 1 on batches of 8: a step that costs almost nothing, so the framework's fixed cost shows."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)

    @staticmethod
    def loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(out, y)

    @staticmethod
    def batch(g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(8, 16, generator=g), torch.randn(8, 1, generator=g)


MODELS: dict[str, type[torch.nn.Module]] = {"lstm": LSTMNet, "mlp": MLPNet, "tiny": TinyNet}
TARGET_MODELS = ("lstm", "mlp")  # the targets are about Lightning's parity models; `tiny` shows fixed costs
LR = 0.02


def make_optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.Adam(model.parameters(), lr=LR)


# ----- turn-taking ----------------------------------------------------------------------------------
class Baton:
    """Exactly one party runs at a time; `hand(name)` passes the turn and `wait(name)` blocks for it."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._turn = "main"

    def hand(self, name: str) -> None:
        with self._cond:
            self._turn = name
            self._cond.notify_all()

    def wait(self, name: str, timeout: float = 600.0) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: self._turn == name, timeout=timeout):
                raise TimeoutError(f"{name} waited {timeout:.0f} s for its turn")


class Clock:
    """Counts batch fetches; at each window boundary records the window's time and yields the turn."""

    def __init__(self, name: str, baton: Baton, warmup: int, window: int, rounds: int, threads: int) -> None:
        self.name, self.baton, self.threads = name, baton, threads
        self.boundaries = [warmup + j * window for j in range(rounds + 1)]
        self.count, self.start, self.cpu_start = 0, 0.0, 0.0
        self.windows: list[float] = []  # wall-clock seconds
        self.cpu_windows: list[float] = []  # CPU seconds of the whole process (our threads only)

    def tick(self) -> None:
        n, self.count = self.count, self.count + 1
        if n not in self.boundaries:
            return
        now, cpu = time.perf_counter(), time.process_time()
        if n > self.boundaries[0]:
            self.windows.append(now - self.start)
            self.cpu_windows.append(cpu - self.cpu_start)
        if torch.get_num_threads() != self.threads:  # a framework changed it: the comparison would be unfair
            raise RuntimeError(
                f"{self.name}: torch uses {torch.get_num_threads()} threads, not {self.threads}"
            )
        if n == self.boundaries[-1]:
            return  # the last window: finish the run in this turn, then hand back
        self.baton.hand("main")
        self.baton.wait(self.name)
        self.cpu_start, self.start = time.process_time(), time.perf_counter()


class TimedBatches(Dataset):
    """`length` pre-made batches (cycling through a few distinct ones); fetching one ticks the clock."""

    def __init__(self, batches: list[Any], length: int, clock: Clock) -> None:
        self.batches, self.length, self.clock = batches, length, clock

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> Any:
        self.clock.tick()
        return self.batches[i % len(self.batches)]


# ----- the contenders: each trains on a DataLoader until it runs out ----------------------------------
def run_raw(model: torch.nn.Module, loader: DataLoader, workdir: str) -> None:
    opt = make_optimizer(model)
    model.train()
    for x, y in loader:
        loss = model.loss(model(x), y)  # type: ignore[operator]
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def _tandem(model: torch.nn.Module, loader: DataLoader, workdir: str, defaults: bool) -> None:
    from trainer import Task, Trainer

    class Wrapped(Task):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            loss = self.model.loss(self.model(x), y)
            self.log("train/loss", loss, prog_bar=True)
            return loss

        def configure_optimizers(self) -> Any:
            return make_optimizer(self)

    off = {} if defaults else dict(logger=False, enable_progress_bar=False, enable_checkpointing=False)
    trainer = Trainer(
        max_epochs=1, accelerator="cpu", default_root_dir=workdir, enable_model_summary=defaults, **off
    )
    trainer.fit(Wrapped(), train_dataloaders=loader)


def _lightning_module() -> Any:
    try:
        import lightning.pytorch as pl
    except ImportError:
        import pytorch_lightning as pl
    return pl


def _lightning(model: torch.nn.Module, loader: DataLoader, workdir: str, defaults: bool) -> None:
    pl = _lightning_module()

    class Wrapped(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            loss = self.model.loss(self.model(x), y)
            self.log("train/loss", loss, prog_bar=True)
            return loss

        def configure_optimizers(self) -> Any:
            return make_optimizer(self)

    off = (
        {}
        if defaults
        else dict(
            logger=False, enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False
        )
    )
    trainer = pl.Trainer(max_epochs=1, accelerator="cpu", devices=1, default_root_dir=workdir, **off)
    trainer.fit(Wrapped(), train_dataloaders=loader)


def lightning_available() -> bool:
    try:
        _lightning_module()
    except ImportError:
        return False
    return True


def contenders(with_lightning: bool) -> dict[str, Callable[[torch.nn.Module, DataLoader, str], None]]:
    out: dict[str, Callable[[torch.nn.Module, DataLoader, str], None]] = {
        "raw": run_raw,
        "raw-again": run_raw,  # an A/A control: its ratio shows the harness's noise and bias (ideally 1.000)
        "tandem": lambda m, dl, d: _tandem(m, dl, d, defaults=False),
        "tandem-defaults": lambda m, dl, d: _tandem(m, dl, d, defaults=True),
    }
    if with_lightning:
        out["lightning"] = lambda m, dl, d: _lightning(m, dl, d, defaults=False)
        out["lightning-defaults"] = lambda m, dl, d: _lightning(m, dl, d, defaults=True)
    return out


# ----- one model, all contenders, interleaved -------------------------------------------------------
def measure(
    model_name: str, names: dict[str, Callable[..., None]], args: argparse.Namespace
) -> dict[str, Any]:
    baton = Baton()
    g = torch.Generator().manual_seed(0)
    cls = MODELS[model_name]
    batches = [cls.batch(g) for _ in range(8)]  # type: ignore[attr-defined]
    length = args.warmup + args.rounds * args.window + 2  # +2: Lightning fetches one batch ahead
    clocks: dict[str, Clock] = {}
    errors: dict[str, BaseException] = {}
    threads: dict[str, threading.Thread] = {}
    tmp = tempfile.TemporaryDirectory(prefix="tandem-overhead-")

    def body(name: str, fn: Callable[..., None], clock: Clock) -> None:
        try:
            baton.wait(name)
            torch.set_num_threads(args.threads)
            torch.manual_seed(0)
            loader = DataLoader(TimedBatches(batches, length, clock), batch_size=None)
            fn(cls(), loader, os.path.join(tmp.name, name))
            if len(clock.windows) != args.rounds:
                raise RuntimeError(f"{name} timed {len(clock.windows)} windows, expected {args.rounds}")
        except BaseException as e:  # report to the main thread; never leave it waiting
            errors[name] = e
        finally:
            baton.hand("main")

    # The first thread that trains ran 2-4% slower than later identical ones (seen with the raw-again
    # control on `tiny`; malloc arenas play a part: MALLOC_ARENA_MAX=1 halves it). A pilot thread takes
    # that place and idles, alive, until the contenders are done.
    done = threading.Event()

    def pilot() -> None:
        torch.set_num_threads(args.threads)
        run_raw(cls(), DataLoader(batches * 4, batch_size=None), "")  # type: ignore[arg-type]
        done.wait()

    pilot_thread = threading.Thread(target=pilot, daemon=True, name="pilot")
    pilot_thread.start()
    for name, fn in names.items():
        clocks[name] = Clock(name, baton, args.warmup, args.window, args.rounds, args.threads)
        threads[name] = threading.Thread(target=body, args=(name, fn, clocks[name]), daemon=True, name=name)
        threads[name].start()
    shuffler = random.Random(0)
    for r in range(args.rounds + 1):  # round 0: setup and warm-up of each contender
        order = list(names)
        if r:  # a fresh random order each round: no contender always follows the same one
            shuffler.shuffle(order)
        for name in order:
            if not threads[name].is_alive():  # its data ran out early: it would never hand the turn back
                raise RuntimeError(f"contender {name!r} stopped before its last window on {model_name}")
            baton.hand(name)
            baton.wait("main")
            if name in errors:
                raise RuntimeError(f"contender {name!r} failed on {model_name}") from errors[name]
    for t in threads.values():
        t.join(timeout=600)
    done.set()
    pilot_thread.join(timeout=60)
    tmp.cleanup()
    return {n: {"wall": clocks[n].windows, "cpu": clocks[n].cpu_windows} for n in names}


def summarize(runs: list[dict[str, dict[str, list[float]]]], window: int) -> dict[str, Any]:
    """Per contender: median ms/step, and the median over rounds (of all runs) of its ratio to the raw
    loop's window of the same round."""
    wall = {n: [w for run in runs for w in run[n]["wall"]] for n in runs[0]}
    cpu = {n: [w for run in runs for w in run[n]["cpu"]] for n in runs[0]}
    out: dict[str, Any] = {}
    for name in wall:
        ratios = [w / r for w, r in zip(wall[name], wall["raw"])]
        cpu_ratios = [w / r for w, r in zip(cpu[name], cpu["raw"])]
        extra = [(w - r) / window for w, r in zip(wall[name], wall["raw"])]
        cpu_extra = [(w - r) / window for w, r in zip(cpu[name], cpu["raw"])]
        out[name] = {
            "ms_per_step": 1e3 * statistics.median(wall[name]) / window,
            "ratio_to_raw": statistics.median(ratios),
            "ratio_iqr": _iqr(ratios),
            "overhead_us_per_step": 1e6 * statistics.median(extra),
            "cpu_ms_per_step": 1e3 * statistics.median(cpu[name]) / window,
            "cpu_ratio_to_raw": statistics.median(cpu_ratios),
            "cpu_ratio_iqr": _iqr(cpu_ratios),
            "cpu_overhead_us_per_step": 1e6 * statistics.median(cpu_extra),
            "window_s": wall[name],
            "cpu_window_s": cpu[name],
        }
    return out


def _iqr(xs: list[float]) -> list[float]:
    if len(xs) < 4:
        return [min(xs), max(xs)]
    q = statistics.quantiles(xs, n=4)
    return [q[0], q[2]]


# ----- import time ----------------------------------------------------------------------------------
def import_time(statement: str, repeats: int) -> float:
    """Median seconds `statement` (an import) takes in a fresh interpreter that has already imported torch."""
    code = f"import time, torch\nt = time.perf_counter()\n{statement}\nprint(time.perf_counter() - t)\n"
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    times = []
    for _ in range(repeats):
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
        )
        times.append(float(out.stdout.strip().splitlines()[-1]))
    return statistics.median(times)


# ----- output ---------------------------------------------------------------------------------------
def table(results: dict[str, dict[str, Any]]) -> str:
    """ms/step and ratios by wall clock, then by CPU time; the verdict needs both within the target."""
    head = (
        f"{'model':<6} {'contender':<19} {'ms/step':>8} {'x raw':>7} {'(IQR)':<13} "
        f"{'cpu x raw':>9} {'(IQR)':<13} {'+cpu us/step':>12}  target"
    )
    lines = [head, "-" * len(head)]
    for model, res in results.items():
        for name, r in res.items():
            target = TARGETS.get(name) if model in TARGET_MODELS else None
            within = [target is not None and r[k] <= target for k in ("ratio_to_raw", "cpu_ratio_to_raw")]
            verdict = (
                ""
                if target is None
                else f"<= {target:.2f} "
                + ("ok" if all(within) else "unclear (noise)" if any(within) else "MISSED")
            )
            lines.append(
                f"{model:<6} {name:<19} {r['ms_per_step']:>8.3f} {r['ratio_to_raw']:>7.3f} {_fmt(r['ratio_iqr']):<13} "
                f"{r['cpu_ratio_to_raw']:>9.3f} {_fmt(r['cpu_ratio_iqr']):<13} {r['cpu_overhead_us_per_step']:>12.1f}  "
                f"{verdict}"
            )
    return "\n".join(lines)


def _fmt(iqr: list[float]) -> str:
    return f"{iqr[0]:.3f}-{iqr[1]:.3f}"


@contextlib.contextmanager
def quiet(show_bars: bool) -> Iterator[None]:
    """Send progress bars and framework chatter to /dev/null while measuring."""
    logging.getLogger("lightning").setLevel(logging.ERROR)
    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if show_bars:
            yield
            return
        with (
            open(os.devnull, "w") as devnull,
            contextlib.redirect_stdout(devnull),
            contextlib.redirect_stderr(devnull),
        ):
            yield


def machine(with_lightning: bool) -> dict[str, Any]:
    info: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "lightning": _lightning_module().__version__ if with_lightning else None,
        "platform": platform.platform(),
        "cpu": _cpu_name(),
        "cpu_count": os.cpu_count(),
        "load_average_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
    }
    return info


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description="Per-step overhead of Tandem vs a raw loop (and Lightning).")
    p.add_argument(
        "--quick", action="store_true", help="1 run of 5 rounds instead of 3 of 15; 3 import timings, not 7"
    )
    p.add_argument("--runs", type=int, default=None, help="independent runs (fresh threads and models)")
    p.add_argument("--rounds", type=int, default=None, help="timed windows per contender and run")
    p.add_argument("--window", type=int, default=50, help="steps per timed window (a multiple of 50)")
    p.add_argument(
        "--warmup", type=int, default=60, help="untimed steps first (>= 50: includes a logging step)"
    )
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads for every contender")
    p.add_argument("--models", default="lstm,mlp,tiny", help="comma-separated subset of: " + ",".join(MODELS))
    p.add_argument("--only", default=None, help="comma-separated contenders to run (raw is always run)")
    p.add_argument("--no-lightning", action="store_true", help="skip Lightning even when it is installed")
    p.add_argument("--import-repeats", type=int, default=None, help="fresh interpreters per import timing")
    p.add_argument("--show-bars", action="store_true", help="draw progress bars instead of discarding them")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "overhead.json"))
    args = p.parse_args(argv)
    args.rounds = args.rounds or (5 if args.quick else 15)
    args.runs = args.runs or (1 if args.quick else 3)
    args.import_repeats = args.import_repeats or (3 if args.quick else 7)

    load_at_start = round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None
    torch.set_num_threads(args.threads)
    with_lightning = not args.no_lightning and lightning_available()
    if not with_lightning:
        print(
            "PyTorch Lightning not measured (install it with `pip install pytorch-lightning`, or `make bench`)."
        )
    names = contenders(with_lightning)
    if args.only:
        keep = {"raw", *args.only.split(",")}
        names = {n: fn for n, fn in names.items() if n in keep}
    results: dict[str, Any] = {}
    for model in args.models.split(","):
        print(
            f"measuring {model}: {len(names)} contenders x {args.runs} runs x {args.rounds} windows "
            f"of {args.window} steps ..."
        )
        with quiet(args.show_bars):  # each run: fresh threads, models and trainers
            results[model] = summarize([measure(model, names, args) for _ in range(args.runs)], args.window)

    # `import trainer` alone is lazy (PEP 562); what a user pays is the import of Task and Trainer.
    imports = {
        "import trainer": import_time("import trainer", args.import_repeats),
        "from trainer import Task, Trainer": import_time(
            "from trainer import Task, Trainer", args.import_repeats
        ),
    }
    if with_lightning:
        pl_name = "lightning.pytorch" if _has("lightning.pytorch") else "pytorch_lightning"
        imports[f"import {pl_name}"] = import_time(f"import {pl_name}", args.import_repeats)

    print()
    print(table(results))
    print()
    for stmt, secs in imports.items():
        ok = secs < IMPORT_TARGET_S
        verdict = f" (target < {IMPORT_TARGET_S} s: {'ok' if ok else 'MISSED'})" if "trainer" in stmt else ""
        print(f"{stmt + ' (after torch):':<52} {secs:.3f} s{verdict}")
    info = machine(with_lightning)
    info["load_average_1m_at_start"] = load_at_start
    print(
        f"\n{info['date']}: {info['cpu_count']} x {info['cpu']}, torch {info['torch']}, "
        f"Lightning {info['lightning']}, {args.threads} torch thread(s), load average {load_at_start} at start, {info['load_average_1m']} at end"
    )

    report = {
        "machine": info,
        "settings": {
            k: getattr(args, k) for k in ("runs", "rounds", "window", "warmup", "threads", "models")
        },
        "targets": {"ratio_to_raw": TARGETS, "import_s": IMPORT_TARGET_S},
        "results": results,
        "import_s_after_torch": imports,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    print(f"wrote {os.path.relpath(args.out)}")
    return report


def _has(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


if __name__ == "__main__":
    main()
