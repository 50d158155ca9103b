"""The loop's fixed cost per step as work, not time: Python bytecodes and calls per step beyond a raw loop.

    python benchmarks/overhead_count.py                 # floor, tandem (all off), tandem-defaults on `tiny`
    python benchmarks/overhead_count.py --top 20        # and the 20 functions that add the most bytecodes
    python benchmarks/overhead_count.py --ref d21ce1a   # the same count for an older commit, side by side
    python benchmarks/overhead_count.py --no-draw       # defaults' bar never redraws mid-epoch: deterministic

Why: on a shared 2-core machine a 15 µs difference per step is within the noise of any clock (see
benchmarks/overhead.py, which measures time). The number of Python bytecodes the interpreter executes per
step does not depend on load: it is counted with `sys.settrace` opcode events in every Python frame (Tandem's,
torch's, the standard library's). A contender's count per step is (count over 1200 steps - count over 200
steps) / 1000, so setup and teardown cancel; the raw loop's count (the same model, optimizer, loader) is
subtracted. `floor` is benchmarks/overhead_models.py's run_floor: the least any trainer keeping Lightning's
per-step contract with logging and a bar on adds to the raw loop. Bytecodes run inside C (the kernels, autograd) are not counted: this is the Python overhead only.
The one count that depends on time is the progress bar's redraw in `tandem-defaults` and `floor` (at most every 0.1 s of
wall clock, and tracing makes a step far slower than it is, so it redraws every few steps here instead of every
few hundred); `--no-draw` gives the bar a huge min_interval_s, so that row counts what a step that draws
nothing costs, the same on any machine.

`--ref COMMIT` checks the commit out into a temporary git worktree and runs this script there (with this
file, so old commits count the same way), then prints both.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import subprocess
import sys
import tempfile
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # first: benchmarks/ (a script's sys.path[0]) holds a strategies.py

import torch  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

from benchmarks import overhead_models  # noqa: E402
from benchmarks.overhead_models import TinyNet, run_raw, wrapped  # noqa: E402

SHORT, LONG = 200, 1200


class _Counter:
    """Counts opcode events and calls per function while installed with sys.settrace."""

    def __init__(self) -> None:
        self.ops: collections.Counter[str] = collections.Counter()
        self.calls = 0

    def trace(self, frame: Any, event: str, arg: Any) -> Any:
        if event == "call":
            self.calls += 1
            frame.f_trace_opcodes = True
            return self.trace
        if event == "opcode":
            code = frame.f_code
            self.ops[f"{_short(code.co_filename)}:{code.co_name}"] += 1
        return self.trace


def _short(path: str) -> str:
    if "site-packages" in path:
        return path.split("site-packages/", 1)[1]
    return os.path.relpath(path, ROOT) if path.startswith(ROOT) else os.path.basename(path)


class _Batches(Dataset):
    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.n, self.data = n, [TinyNet.batch(g) for _ in range(64)]

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        return self.data[i % 64]


def _tandem(n: int, counter: _Counter, defaults: bool, draw: bool = True) -> None:
    from callbacks import TQDMProgressBar
    from trainer import Task, Trainer

    off = {} if defaults else dict(logger=False, enable_progress_bar=False, enable_checkpointing=False)
    if defaults and not draw:
        off["callbacks"] = [TQDMProgressBar(min_interval_s=1e9)]
    loader = DataLoader(_Batches(n), batch_size=None)
    with tempfile.TemporaryDirectory() as d, open(os.devnull, "w") as null:
        with contextlib.redirect_stderr(null), contextlib.redirect_stdout(null):
            trainer = Trainer(
                max_epochs=1, accelerator="cpu", default_root_dir=d, enable_model_summary=False, **off
            )
            task = wrapped(Task, TinyNet())
            sys.settrace(counter.trace)
            try:
                trainer.fit(task, train_dataloaders=loader)
            finally:
                sys.settrace(None)


def _raw(n: int, counter: _Counter) -> None:
    model, loader = TinyNet(), DataLoader(_Batches(n), batch_size=None)
    sys.settrace(counter.trace)
    try:
        run_raw(model, loader, "")
    finally:
        sys.settrace(None)


def _floor(n: int, counter: _Counter, draw: bool = True) -> None:
    model, loader = TinyNet(), DataLoader(_Batches(n), batch_size=None)
    with tempfile.TemporaryDirectory() as d, open(os.devnull, "w") as null:
        with contextlib.redirect_stderr(null), contextlib.redirect_stdout(null):
            sys.settrace(counter.trace)
            try:
                overhead_models.run_floor(model, loader, d, min_interval_s=0.1 if draw else 1e9)
            finally:
                sys.settrace(None)


def per_step(run: Any) -> tuple[collections.Counter[str], float]:
    """Opcodes per step by function, and calls per step, of `run(n, counter)` (setup and teardown cancel)."""
    run(SHORT, _Counter())  # warm: first-use imports and caches
    short, long = _Counter(), _Counter()
    run(SHORT, short)
    run(LONG, long)
    steps = LONG - SHORT
    ops = collections.Counter({k: (long.ops[k] - short.ops.get(k, 0)) / steps for k in long.ops})
    return ops, (long.calls - short.calls) / steps


def measure(top: int, draw: bool = True) -> dict[str, Any]:
    torch.set_num_threads(1)
    raw_ops, raw_calls = per_step(_raw)
    out: dict[str, Any] = {"raw": {"opcodes": round(sum(raw_ops.values()), 1), "calls": round(raw_calls, 1)}}
    runs = {
        "floor": lambda n, c: _floor(n, c, draw),
        "tandem": lambda n, c: _tandem(n, c, False, draw),
        "tandem-defaults": lambda n, c: _tandem(n, c, True, draw),
    }
    if not hasattr(overhead_models, "run_floor"):  # counted with --ref at a commit before the floor existed
        del runs["floor"]
    for name, run in runs.items():
        ops, calls = per_step(run)
        extra = {k: ops.get(k, 0) - raw_ops.get(k, 0) for k in set(ops) | set(raw_ops)}
        out[name] = {
            "opcodes": round(sum(ops.values()), 1),
            "extra_opcodes": round(sum(ops.values()) - sum(raw_ops.values()), 1),
            "extra_calls": round(calls - raw_calls, 1),
            "top": [[k, round(v, 1)] for k, v in sorted(extra.items(), key=lambda kv: -kv[1])[:top]],
        }
    return out


def _at_ref(ref: str, top: int, draw: bool = True) -> dict[str, Any]:
    """This script's measurement run in a temporary worktree of commit `ref`."""
    with tempfile.TemporaryDirectory() as d:
        tree = os.path.join(d, "tree")
        subprocess.run(["git", "-C", ROOT, "worktree", "add", "-q", "--detach", tree, ref], check=True)
        try:
            script = os.path.join(tree, "benchmarks", "overhead_count_at_ref.py")
            with open(__file__) as src, open(script, "w") as dst:
                dst.write(src.read())
            done = subprocess.run(
                [sys.executable, "-P", script, "--top", str(top), "--json", *([] if draw else ["--no-draw"])],
                cwd=tree, check=True, capture_output=True, text=True,
            )  # fmt: skip
            return json.loads(done.stdout.strip().splitlines()[-1])
        finally:
            subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", tree], check=False)


def _print(label: str, result: dict[str, Any]) -> None:
    print(
        f"{label}: raw loop {result['raw']['opcodes']:.0f} opcodes, {result['raw']['calls']:.0f} calls per step"
    )
    for name in (k for k in result if k != "raw"):
        r = result[name]
        print(f"  {name:<16} +{r['extra_opcodes']:.0f} opcodes, +{r['extra_calls']:.1f} calls per step")
        for fn, v in r["top"]:
            print(f"      {v:8.1f}  {fn}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--top", type=int, default=0, help="list the N functions that add the most opcodes")
    p.add_argument("--ref", default=None, help="also count at this commit (a temporary git worktree)")
    p.add_argument("--json", action="store_true", help="print only the result as one JSON line")
    p.add_argument("--no-draw", action="store_true", help="tandem-defaults' bar never redraws mid-epoch")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "overhead_count.json"))
    args = p.parse_args(argv)
    result = measure(args.top, draw=not args.no_draw)
    if args.json:
        print(json.dumps(result))
        return 0
    report = {"head": result}
    if args.ref:
        report[args.ref] = _at_ref(args.ref, args.top, draw=not args.no_draw)
        _print(f"at {args.ref}", report[args.ref])
    _print("this checkout", result)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    print(f"wrote {os.path.relpath(args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
