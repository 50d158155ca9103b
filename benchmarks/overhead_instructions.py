"""The loop's fixed cost per step as machine instructions: Python and C together, counted by valgrind.

    python -P benchmarks/overhead_instructions.py              # raw, tandem, tandem-defaults on `tiny`
    python -P benchmarks/overhead_instructions.py --ref b35b586  # and the same at an older commit

Why: benchmarks/overhead.py measures time, and on this shared 2-core machine its noise per run (the
`raw-again` control: +-10 us) is as large as the differences in question; benchmarks/overhead_count.py counts
Python bytecodes, which leaves out what those bytecodes cost in C (an AttributeError built and dropped, a
tensor's `detach`, a context manager of torch's). Here every contender trains `tiny` under valgrind's
cachegrind (`--cache-sim=no`: instructions only) for 200 and for 1200 steps; (instructions at 1200 - at 200)
/ 1000 is one step's, setup and teardown cancel, and the raw loop's is subtracted. Every thread counts
(valgrind runs one at a time; the kernel's work is not counted). Hash randomization and BLAS threads are
fixed (PYTHONHASHSEED=0, one OpenBLAS thread): one checkout at one path then counts exactly the same twice,
but two checkouts of the same loop at different paths differed by 1,350 instructions per step, and counts
from different sessions by more (51,416 and 62,519 beyond raw for the same loop): compare only counts of
one run, and mind that `--ref` checks out into a temporary path of another length. Needs valgrind
(`apt-get install valgrind`); ten valgrind runs of one to two minutes each per checkout, as many at once as
there are cores.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHORT, LONG = 200, 1200
CONTENDERS = ("raw", "raw-closure", "floor", "tandem", "tandem-defaults")

# One training run of a contender on `tiny`, the model, data and options of benchmarks/overhead.py.
RUN = r"""
import sys, tempfile
sys.path.insert(0, sys.argv[3])
import torch
from torch.utils.data import DataLoader
from benchmarks.overhead_models import TinyNet, run_floor, run_raw, run_raw_closure, wrapped
name, n = sys.argv[1], int(sys.argv[2])
g = torch.Generator().manual_seed(0)
loader = DataLoader([TinyNet.batch(g) for _ in range(8)] * (n // 8), batch_size=None)
if name == "raw":
    run_raw(TinyNet(), loader, "")
elif name == "raw-closure":
    run_raw_closure(TinyNet(), loader, "")
elif name == "floor":  # its bar never redraws mid-epoch either
    run_floor(TinyNet(), loader, tempfile.mkdtemp(), min_interval_s=1e9)
else:
    from trainer import Task, Trainer
    if name == "tandem":
        opts = dict(logger=False, enable_progress_bar=False, enable_checkpointing=False)
    else:  # the defaults, with a bar that never redraws mid-epoch (a redraw depends on the clock)
        from callbacks.progress.tqdm_bar import TQDMProgressBar
        opts = dict(callbacks=[TQDMProgressBar(min_interval_s=1e9)])
    trainer = Trainer(max_epochs=1, accelerator="cpu", default_root_dir=tempfile.mkdtemp(),
                      enable_model_summary=False, **opts)
    trainer.fit(wrapped(Task, TinyNet()), train_dataloaders=loader)
"""


def instructions(tree: str, name: str, steps: int) -> int:
    """Instructions valgrind counts for one run of `name` with `steps` steps, on the checkout at `tree`."""
    env = {**os.environ, "PYTHONHASHSEED": "0", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            "valgrind", "--tool=cachegrind", "--cache-sim=no", f"--cachegrind-out-file={tmp}/out",
            sys.executable, "-P", "-c", RUN, name, str(steps), tree,
        ]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp)
    found = re.search(r"I\s+refs:\s+([\d,]+)", done.stderr)
    if done.returncode or not found:
        raise RuntimeError(f"{name} ({steps} steps) under valgrind failed:\n{done.stderr[-2000:]}")
    return int(found.group(1).replace(",", ""))


def per_step(tree: str) -> dict[str, float]:
    """Instructions per step of each contender, and of each beyond the raw loop's."""
    runs = [(name, steps) for name in CONTENDERS for steps in (LONG, SHORT)]
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:  # counts do not depend on what runs beside them
        counts = dict(zip(runs, pool.map(lambda run: instructions(tree, *run), runs)))
    out: dict[str, float] = {}
    for name in CONTENDERS:
        out[name] = (counts[name, LONG] - counts[name, SHORT]) / (LONG - SHORT)
    for name in CONTENDERS[1:]:
        out[f"{name} beyond raw"] = out[name] - out["raw"]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ref", default=None, help="also count at this commit (a temporary git worktree)")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "overhead_instructions.json"))
    args = p.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed: apt-get install valgrind")
    result = {"this checkout": per_step(ROOT)}
    if args.ref:
        tree = tempfile.mkdtemp(prefix="tandem-ref-")
        subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", tree, args.ref], check=True,
                       capture_output=True)  # fmt: skip
        try:
            result[args.ref] = per_step(tree)
        finally:
            subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", tree], check=False)
    for where, counts in result.items():
        print(where)
        for name, value in counts.items():
            print(f"  {name:28s} {value:12,.0f} instructions per step")
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {os.path.relpath(args.out)}")


if __name__ == "__main__":
    main()
