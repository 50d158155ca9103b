"""What a failure costs, side by side in one run in the two-node network lab (benchmarks/lab.py): in-place fault
tolerance on torchft (two replica groups, one per node) against today's heal, a torchrun restart of every worker
from the last checkpoint, taken every N steps. Also the cost of fault tolerance without a failure (a quorum per
step). Needs root (network namespaces) and the fault-tolerance extra.

Every job is tests/scripts/replica_train.py for `--steps` steps of `--step-sleep` s (a stand-in for compute);
node1's worker is SIGKILLed when node0 reaches step `--kill-at` + N/2 (half a checkpoint interval after a
checkpoint: the mean loss of a failure at a random time); a restarted worker first waits `--restart-delay` s
(0: this small job's own restart; 20: a stand-in for a larger job's, which loads its model and checkpoint):

- plain ddp: `--nnodes=2` torchrun with `--max-restarts=1`, `ModelCheckpoint(every_n_train_steps=N)`,
  `resume="auto"`: both workers restart and recompute the steps since the checkpoint;
- fault-tolerant ddp: node0's group trains on; node1's torchrun restarts its worker, which rejoins from node0.

Columns: step_ms (median step before the failure), quorum_ms (the quorum and commit per step, measured in the
worker), train_s (node0's first to last step), steps_lost (steps recomputed after the restart; not committed
with fault tolerance), train_lost_s (train_s minus the same job's without a failure), back_s (from the kill to
the first step of a restarted worker), longest_step_s (node0's longest step after the kill), alone_steps (steps
node0's group committed alone while node1's was away: node1's share of those batches skipped).

    python benchmarks/fault_tolerance.py [--steps 300] [--kill-at 150] [--ckpt-every 10 50] [--restart-delay 0 20]

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


def run(
    lab: Lab,
    out: Path,
    args: argparse.Namespace,
    mode: str,
    kill_at: int | None,
    ckpt: int,
    delay: float = 0.0,
) -> dict[str, float]:
    """One job to `args.steps` steps; node1's worker killed when node0 reaches `kill_at` (None: no failure),
    restarted workers waiting `delay` s first."""
    script = ["--epochs", "100000", "--step-sleep", str(args.step_sleep), "--timeout-s", "10"]
    script += ["--ckpt-every", str(ckpt), "--restart-delay", str(delay)]
    kill = kill_at is not None
    job = LabJob(lab, out, script, mode=mode, min_replicas=1 if kill else 2, restarts=1 if kill else 0)
    job.stop_at(args.steps)
    killed_at = float("inf")
    if kill_at is not None:
        job.wait_step(0, kill_at, timeout=300)
        job.kill_worker(1)
        killed_at = time.monotonic()
    codes = job.wait(timeout=900)
    if codes != [0, 0]:
        raise RuntimeError(f"{mode} job failed {codes}:\n{job.output(0)[-2000:]}\n{job.output(1)[-2000:]}")
    steps = job.steps(0)
    # node0's training, first step to last (the start-up of the processes, which varies, left out)
    row: dict[str, float] = {"train_s": steps[-1].t - steps[0].t}
    row["step_ms"] = 1e3 * statistics.median(s.dt for s in steps[5:] if s.t < killed_at - 1)
    if mode == "plain":
        row["steps_lost"] = len(steps) - len({s.gs for s in steps})  # recomputed after the restart
        watched = steps  # node0's restarted worker: training again
    else:
        row["steps_lost"] = sum(not s.committed for s in steps)  # not committed: the update dropped
        said = re.findall(r"quorum and commit: ([\d.]+) ms a step", job.output(0))
        row["quorum_ms"] = float(said[-1]) if said else float("nan")  # as the worker measured it
        watched = job.steps(1)  # node1's restarted worker: rejoined
    if kill:
        first = watched[0].pid if mode == "plain" else job.steps(1)[0].pid
        back = [s for s in watched if s.t > killed_at and s.pid != first]
        row["back_s"] = back[0].t - killed_at if back else float("nan")
        if mode == "ft":
            after = [s for s in steps if s.t > killed_at]
            row["longest_step_s"] = max(s.dt for s in after)
            # committed by node0's group alone while node1's was away (its share of the data skipped)
            row["alone_steps"] = sum(s.committed and s.participants < 2 for s in after)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--kill-at", type=int, default=150)
    p.add_argument("--ckpt-every", type=int, nargs="+", default=[10, 50])
    p.add_argument("--step-sleep", type=float, default=0.05)
    p.add_argument("--restart-delay", type=float, nargs="+", default=[0.0, 20.0],
                   help="restarted workers wait this long first (a larger job's restart)")  # fmt: skip
    p.add_argument("--keep", help="keep the jobs' logs in this directory")
    args = p.parse_args()
    rows: dict[str, dict[str, float]] = {}
    base: dict[str, dict[str, float]] = {}
    with guarded(Lab.up()) as lab, tempfile.TemporaryDirectory() as tmp:
        root = Path(args.keep) if args.keep else Path(tmp)
        for n in args.ckpt_every:  # killed half a checkpoint interval after a checkpoint: N/2 steps to redo
            base[f"plain{n}"] = rows[f"plain ddp, no failure, checkpoint every {n}"] = run(
                lab, root / f"plain{n}", args, "plain", None, n
            )
        n = args.ckpt_every[0]
        base["ft"] = rows["fault-tolerant ddp, no failure"] = run(lab, root / "ft", args, "ft", None, n)
        for delay in args.restart_delay:
            for m in args.ckpt_every:
                row = run(
                    lab, root / f"plain{m}-kill{delay:g}", args, "plain", args.kill_at + m // 2, m, delay
                )
                row["train_lost_s"] = row["train_s"] - base[f"plain{m}"]["train_s"]
                rows[f"plain ddp, 1 kill, restart {delay:g}s, from checkpoint every {m}"] = row
            row = run(lab, root / f"ft-kill{delay:g}", args, "ft", args.kill_at + n // 2, n, delay)
            row["train_lost_s"] = row["train_s"] - base["ft"]["train_s"]
            rows[f"fault-tolerant ddp, 1 kill, restart {delay:g}s, rejoin from the live group"] = row
    keys = ["step_ms", "quorum_ms", "train_s", "steps_lost", "train_lost_s", "back_s", "longest_step_s"]
    keys.append("alone_steps")
    width = max(map(len, rows))
    print(f"{'':<{width}}  " + "  ".join(f"{k:>14}" for k in keys))
    for name, row in rows.items():
        print(
            f"{name:<{width}}  " + "  ".join(f"{row[k]:>14.2f}" if k in row else f"{'-':>14}" for k in keys)
        )
    plain = next(v for k, v in rows.items() if k.startswith("plain ddp, no failure"))
    ft = rows["fault-tolerant ddp, no failure"]
    print(f"per-step quorum: fault-tolerant step {ft['step_ms']:.1f} ms vs plain {plain['step_ms']:.1f} ms "
          f"({ft['step_ms'] / plain['step_ms']:.2f}x)")  # fmt: skip
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "fault_tolerance.json"), "w") as f:
        json.dump({"settings": vars(args), "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
