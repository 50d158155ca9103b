"""Failure modes of a two-node job in the network lab, observed (not asserted); every run is bounded.

python tests/scripts/lab_faults.py sigkill [--tries 5]   # node1's worker SIGKILLs itself; --max-restarts=1
python tests/scripts/lab_faults.py cut [--restarts 0] [--restore-after S]  # node1's link goes down mid-run
python tests/scripts/lab_faults.py settings [--timeout 150]  # each subset of the two-node settings

Prints one line per try: each node's exit code (None: still running at the deadline, then killed), seconds
since the start, the first error lines, and whether the final weights equal an uninterrupted run's.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import torch  # noqa: E402
from netlab import ALL_SETTINGS, TwoNodeJob, run_one_node  # noqa: E402

from benchmarks.lab import Lab, guarded  # noqa: E402

SCRIPT = os.path.join(HERE, "multinode_train.py")
ERRORS = ("Error", "error", "failed", "timed out", "Timeout")


def _first_errors(text: str, n: int = 4) -> list[str]:
    lines = [line.strip() for line in text.splitlines() if any(e in line for e in ERRORS)]
    return [line[:300] for line in lines if not line.startswith(("File ", "frame #", "raise "))][:n]


def _equal(a: Path, b: Path) -> str:
    if not a.exists() or not b.exists():
        return "no weights"
    x, y = torch.load(a), torch.load(b)
    diff = max(float((x[k] - y[k]).abs().max()) for k in x)
    return "bit-identical" if diff == 0 else f"max diff {diff:.2e}"


def _report(label: str, job_results: list, extra: str = "") -> None:
    print(f"--- {label} {extra}")
    for r in job_results:
        print(f"  node{r.node}: rc={r.returncode} after {r.seconds:.1f}s")
        for line in _first_errors(r.output):
            print(f"      {line}")
    sys.stdout.flush()


def sigkill(tmp: Path, tries: int, timeout: float, env: dict[str, str], extra: list[str]) -> None:
    common = ["--ckpt", "--epochs", "3", "--timeout-s", "20", *extra]
    ref = tmp / "ref.pt"
    done = run_one_node(
        [SCRIPT, str(ref), str(tmp / "ref"), "--devices", "2", "--num-nodes", "1", *common], 180
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for i in range(tries):
        where = tmp / f"kill{i}"
        where.mkdir()
        out = where / "w.pt"
        argv = [SCRIPT, str(out), str(where / "root"), "--kill-rank", "1", "--kill-step", "5", *common]
        with guarded(Lab.up()) as lab:
            results = TwoNodeJob(lab, where, argv, max_restarts=1, env=env).wait(timeout)
        _report(f"sigkill try {i + 1}/{tries}", results, f"weights vs uninterrupted: {_equal(ref, out)}")


def _processes(lab: Lab) -> None:
    """Print what still runs in each node (just before the deadline): pid, kernel wait channel, command."""
    for node in (0, 1):
        pids = subprocess.run(
            ["ip", "netns", "pids", lab.ns(node)], capture_output=True, text=True
        ).stdout.split()
        for pid in pids:
            try:
                wchan = Path(f"/proc/{pid}/wchan").read_text()
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:150]
            except OSError:
                continue
            print(f"  still running in node{node}: pid {pid} wchan={wchan} {cmd}", flush=True)


def cut(
    tmp: Path, restarts: int, timeout: float, after: float, env: dict[str, str], restore_after: float | None
) -> None:
    where = tmp / "cut"
    where.mkdir()
    argv = [SCRIPT, str(where / "w.pt"), str(where / "root"), "--epochs", "20", "--step-sleep", "0.1"]
    argv += ["--timeout-s", "20"]
    with guarded(Lab.up()) as lab:
        job = TwoNodeJob(lab, where, argv, max_restarts=restarts, env=env)
        seen = job.wait_for_output(1, "rank 1 at step 1", timeout=120)
        assert seen is not None, job.output(1)[-3000:]
        time.sleep(after)
        lab.cut(1)
        cut_at = time.monotonic() - job.start
        if restore_after is not None:
            time.sleep(restore_after)
            lab.restore(1)
        snapshot = threading.Timer(max(1.0, timeout - cut_at - 8), _processes, (lab,))
        snapshot.start()
        results = job.wait(timeout)
        snapshot.cancel()
    for r in results:
        r.seconds -= cut_at  # report seconds after the cut
    what = "cut" if restore_after is None else f"cut for {restore_after:g}s"
    _report(f"link of node1 {what} (max_restarts={restarts})", results, "(seconds after the cut)")


def settings(tmp: Path, timeout: float) -> None:
    """Each subset of the two-node settings (netlab.ALL_SETTINGS): how the run ends without the others."""
    variants = [
        (),
        ("is_host",),
        ("is_host", "gloo_ifname"),
        ("is_host", "local_addr"),
        ("local_addr", "gloo_ifname"),
    ]
    for chosen in [*variants, ALL_SETTINGS]:
        where = tmp / ("-".join(chosen) or "none")
        where.mkdir()
        argv = [SCRIPT, str(where / "w.pt"), str(where / "root"), "--timeout-s", "20"]
        with guarded(Lab.up()) as lab:
            results = TwoNodeJob(lab, where, argv, settings=chosen).wait(timeout)
        _report(f"settings {chosen or '(none)'}", results)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=["sigkill", "cut", "settings"])
    p.add_argument("--tries", type=int, default=5)
    p.add_argument("--restarts", type=int, default=0)
    p.add_argument("--timeout", type=float, default=240, help="deadline of each job, seconds")
    p.add_argument("--after", type=float, default=2.0, help="cut: seconds after step 1 on node1")
    p.add_argument("--keep", default=None, help="write logs and weights here instead of a temporary folder")
    p.add_argument("--env", action="append", default=[], help="KEY=VALUE for both agents (repeatable)")
    p.add_argument("--restore-after", type=float, default=None, help="cut: bring the link back after this")
    p.add_argument("--script-arg", action="append", default=[], help="extra multinode_train.py argument")
    args = p.parse_args()
    env = dict(item.split("=", 1) for item in args.env)
    with tempfile.TemporaryDirectory(prefix="lab-faults-") as tmp:
        where = (
            Path(tmp) if args.keep is None else Path(tempfile.mkdtemp(prefix="lab-faults-", dir=args.keep))
        )
        if args.what == "settings":
            settings(where, args.timeout)
        elif args.what == "sigkill":
            sigkill(where, args.tries, args.timeout, env, args.script_arg)
        else:
            cut(where, args.restarts, args.timeout, args.after, env, args.restore_after)


if __name__ == "__main__":
    main()
