"""What a failure costs, side by side in one run in the two-node network lab (benchmarks/lab.py): in-place fault
tolerance on torchft (two replica groups, one per node) against today's heal, a torchrun restart of every worker
from the last checkpoint, taken every N steps. Also the cost of fault tolerance without a failure (a quorum per
step). Needs root (network namespaces) and the fault-tolerance extra.

Every job is tests/scripts/replica_train.py for `--steps` steps of `--step-sleep` s (a stand-in for compute),
node1's worker SIGKILLed when node0 reaches step `--kill-at`:

- plain ddp: `--nnodes=2` torchrun with `--max-restarts=1`, `ModelCheckpoint(every_n_train_steps=N)`,
  `resume="auto"`: both workers restart and recompute the steps since the checkpoint;
- fault-tolerant ddp: node0's group trains on; node1's torchrun restarts its worker, which rejoins from node0.

Steps lost: steps whose work was thrown away (recomputed after the restart; not committed with fault tolerance).
Wall time lost: the job's wall time minus the same job's without the failure.

    python benchmarks/fault_tolerance.py [--steps 300] [--kill-at 150] [--ckpt-every 10 50] [--step-sleep 0.05]

Prints a table and writes benchmarks/results/fault_tolerance.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.ft_lab import LabJob  # noqa: E402
from benchmarks.lab import Lab, guarded  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def run(lab: Lab, out: Path, args: argparse.Namespace, mode: str, kill: bool, ckpt: int) -> dict[str, float]:
    """One job to `args.steps` steps; node1's worker killed at `args.kill_at` when `kill`."""
    script = ["--epochs", "100000", "--step-sleep", str(args.step_sleep), "--timeout-s", "10"]
    script += ["--ckpt-every", str(ckpt)] if ckpt else []
    job = LabJob(lab, out, script, mode=mode, min_replicas=1 if kill else 2, restarts=1 if kill else 0)
    job.stop_at(args.steps)
    started = time.monotonic()
    killed_at = None
    if kill:
        job.wait_step(0, args.kill_at, timeout=300)
        job.kill_worker(1)
        killed_at = time.monotonic() - job.start
    codes = job.wait(timeout=600)
    wall = time.monotonic() - started
    if codes != [0, 0]:
        raise RuntimeError(f"{mode} job failed {codes}:\n{job.output(0)[-2000:]}\n{job.output(1)[-2000:]}")
    steps = job.steps(0)
    out_row: dict[str, float] = {"wall_s": wall, "step_ms": 1e3 * statistics.median(s.dt for s in steps[5:])}
    if mode == "plain":
        out_row["steps_lost"] = len(steps) - len({s.gs for s in steps})  # recomputed after the restart
        if killed_at is not None:  # back: the first step recomputed after the restart
            reached = max(s.gs for s in steps if s.t - job.start <= killed_at)
            resumed = [s for s in steps if s.t - job.start > killed_at and s.gs <= reached]
            out_row["back_s"] = resumed[0].t - job.start - killed_at if resumed else float("nan")
    else:
        out_row["steps_lost"] = sum(not s.committed for s in steps)  # not committed: the update dropped
        said = re.findall(r"quorum and commit: ([\d.]+) ms a step", job.output(0))
        out_row["quorum_ms"] = float(said[-1]) if said else float("nan")  # measured inside the worker
        if killed_at is not None:
            after = [s for s in steps if s.t - job.start > killed_at]
            out_row["longest_step_s"] = max(s.dt for s in after)
            # committed by node0's group alone while node1's was away (its share of the data skipped)
            out_row["degraded_steps"] = sum(s.committed and s.participants < 2 for s in after)
            rejoined = [s for s in job.steps(1) if s.t - job.start > killed_at]
            out_row["back_s"] = rejoined[0].t - job.start - killed_at if rejoined else float("nan")
    return out_row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--kill-at", type=int, default=150)
    p.add_argument("--ckpt-every", type=int, nargs="+", default=[10, 50])
    p.add_argument("--step-sleep", type=float, default=0.05)
    args = p.parse_args()
    rows: dict[str, dict[str, float]] = {}
    with guarded(Lab.up()) as lab, tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for n in args.ckpt_every:
            base = run(lab, root / f"plain{n}", args, "plain", kill=False, ckpt=n)
            killed = run(lab, root / f"plain{n}-kill", args, "plain", kill=True, ckpt=n)
            killed["wall_lost_s"] = killed["wall_s"] - base["wall_s"]
            rows[f"plain ddp, no failure, checkpoint every {n}"] = base
            rows[f"plain ddp, 1 kill, restart from checkpoint every {n}"] = killed
        n = args.ckpt_every[0]
        base = run(lab, root / "ft", args, "ft", kill=False, ckpt=n)
        killed = run(lab, root / "ft-kill", args, "ft", kill=True, ckpt=n)
        killed["wall_lost_s"] = killed["wall_s"] - base["wall_s"]
        rows[f"fault-tolerant ddp, no failure (checkpoint every {n})"] = base
        rows["fault-tolerant ddp, 1 kill, rejoin from the live group"] = killed
    keys = ["step_ms", "quorum_ms", "wall_s", "steps_lost", "wall_lost_s", "back_s", "longest_step_s"]
    keys.append("degraded_steps")
    width = max(map(len, rows))
    print(f"{'':<{width}}  " + "  ".join(f"{k:>14}" for k in keys))
    for name, row in rows.items():
        print(
            f"{name:<{width}}  " + "  ".join(f"{row[k]:>14.2f}" if k in row else f"{'-':>14}" for k in keys)
        )
    plain = next(v for k, v in rows.items() if k.startswith("plain ddp, no failure"))
    ft = rows[f"fault-tolerant ddp, no failure (checkpoint every {n})"]
    print(f"per-step quorum: fault-tolerant step {ft['step_ms']:.1f} ms vs plain {plain['step_ms']:.1f} ms "
          f"({ft['step_ms'] / plain['step_ms']:.2f}x)")  # fmt: skip
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "fault_tolerance.json"), "w") as f:
        json.dump({"settings": vars(args), "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
