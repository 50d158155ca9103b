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
  raw-closure         (--ablation) the raw loop through opt.step(closure), as Lightning's contract steps
  tandem-no-log       (--ablation) `tandem` with a task that does not call self.log
  tandem-bare-task    (--ablation) and that calls the model without the two `self.model` lookups: what is
                      left over `raw-closure` is the loop's own cost
  floor               (--ablation) a hand-written loop keeping Lightning's per-step contract with logging
                      and a bar on and nothing else (the same task code, self.log into a dict, two
                      on_train_batch_end callbacks, a tqdm bar, a TensorBoard event every 50 steps): the
                      least any trainer adds per step
  floor-bare-task     (--ablation) the floor with a task that calls the model without the `self.model`
                      lookups: over `raw-closure`, the least a loop's own cost can be with logging and a bar
  tandem-defaults-bare-task
                      (--ablation) `tandem-defaults` with that task: the same, for Tandem's loop
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
import statistics
import subprocess
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# First, even when PYTHONPATH has it: run as a script, benchmarks/ is sys.path[0] and its strategies.py
# would shadow the strategies package that the Trainer imports.
sys.path.insert(0, ROOT)

from overhead_harness import measure, summarize  # noqa: E402
from overhead_models import MODELS, contenders, lightning_available, lightning_module  # noqa: E402

TARGETS = {"tandem": 1.03, "tandem-defaults": 1.10}
TARGET_MODELS = ("lstm", "mlp")  # the targets are about Lightning's parity models; `tiny` shows fixed costs
IMPORT_TARGET_S = 0.3


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
        f"{'model':<6} {'contender':<25} {'ms/step':>8} {'x raw':>7} {'(IQR)':<13} "
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
                f"{model:<6} {name:<25} {r['ms_per_step']:>8.3f} {r['ratio_to_raw']:>7.3f} {_fmt(r['ratio_iqr']):<13} "
                f"{r['cpu_ratio_to_raw']:>9.3f} {_fmt(r['cpu_ratio_iqr']):<13} {r['cpu_overhead_us_per_step']:>12.1f}  "
                f"{verdict}"
            )
    return "\n".join(lines)


def _fmt(iqr: list[float]) -> str:
    """An interquartile range as `low-high`."""
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
    """Date, versions, CPU and load: what the numbers were measured on."""
    info: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "lightning": lightning_module().__version__ if with_lightning else None,
        "platform": platform.platform(),
        "cpu": _cpu_name(),
        "cpu_count": os.cpu_count(),
        "load_average_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
    }
    return info


def _cpu_name() -> str:
    """The CPU model name from /proc/cpuinfo, or what platform knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Parse the command line, measure every model, print the table and write the JSON report."""
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
    p.add_argument(
        "--ablation",
        action="store_true",
        help="also raw-closure, the floor rows and the *-bare-task rows (see below)",
    )
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
    names = contenders(with_lightning, args.ablation)
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
    """Whether `module` can be imported (without importing it)."""
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


if __name__ == "__main__":
    main()
