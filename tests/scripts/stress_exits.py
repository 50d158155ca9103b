"""Stress the exits: many short fits of every strategy, under a CPU load, counting the non-zero exit codes.

A finished run must exit 0. Aborts at interpreter shutdown ("terminate called without an active exception",
exit 134 / -6) are rare and timing-dependent, so each kind runs N times (default 100) one after another
while a busy-loop process loads the CPU:

    python tests/scripts/stress_exits.py [--runs N] [--kinds dp,user-group,...] [--load 1] [--out DIR]

Kinds: single, dp (devices=2 on the CPU), ddp (self-launched, devices=2), ddp-torchrun
(torchrun --nproc_per_node=2), user-group (torchrun; the script calls init_process_group before fit),
fsdp (torchrun, 2 processes). Each run gets its own directory under --out with `ulimit -c unlimited`;
a failed run's directory (its stderr and any core file: core_pattern is read and printed) is kept, a
good run's is removed. PYTHONFAULTHANDLER=1 prints every thread's Python stack at an abort. Prints a table
(runs, failures, runs whose exit found a closed group still referenced, exit codes, wall time) and each
failure's stderr tail; --json writes the numbers.

`--fit KIND` is what each run executes: one short fit (3 steps of a tiny model).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
KINDS = ("single", "dp", "ddp", "ddp-torchrun", "user-group", "fsdp")
TORCHRUN = ("ddp-torchrun", "user-group", "fsdp")
STRATEGY = {
    "single": "single",
    "dp": "dp",
    "ddp": "ddp",
    "ddp-torchrun": "ddp",
    "user-group": "ddp",
    "fsdp": "fsdp",
}


# ----- one run ------------------------------------------------------------------------------------
def fit(kind: str) -> None:
    """One short fit of `kind` (a run of the stress; also a user's script under torchrun)."""
    sys.path.insert(0, ROOT)
    import torch
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, TensorDataset

    from trainer import Task, Trainer, seed_everything

    class Tiny(Task):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))

        def training_step(self, batch, batch_idx):
            x, y = batch
            return F.cross_entropy(self.net(x), y)

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val/loss", F.cross_entropy(self.net(x), y), sync_dist=True)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    if kind == "user-group":
        import torch.distributed as dist

        dist.init_process_group("gloo")  # the user's own group, from torchrun's env://
    seed_everything(0)
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(48, 6, generator=g), torch.randint(0, 3, (48,), generator=g))
    per_rank = 1 if kind in ("single", "dp") else 2
    # every default on (TensorBoard logger, checkpointing, progress bar, summary, sanity check): a real run
    trainer = Trainer(
        strategy=STRATEGY[kind],
        accelerator="cpu",
        devices=1 if kind == "single" else 2,
        max_epochs=1,
        limit_train_batches=3,
        limit_val_batches=2,
        default_root_dir=os.getcwd(),
    )
    loader = DataLoader(data, batch_size=8 * 2 // per_rank)
    trainer.fit(Tiny(), loader, DataLoader(data, batch_size=8))
    print(f"[stress] {kind} rank {trainer.global_rank}: fit returned", file=sys.stderr, flush=True)


def command(kind: str) -> list[str]:
    me = os.path.abspath(__file__)
    if kind in TORCHRUN:
        return [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            me,
            "--fit",
            kind,
        ]
    return [sys.executable, me, "--fit", kind]


def _unlimited_cores() -> None:
    hard = resource.getrlimit(resource.RLIMIT_CORE)[1]
    resource.setrlimit(resource.RLIMIT_CORE, (hard, hard))


def run_once(kind: str, where: str, timeout: float) -> tuple[int | str, str]:
    """(exit code or 'timeout', stderr) of one run in directory `where`."""
    env = dict(os.environ, PYTHONFAULTHANDLER="1", PYTHONPATH=ROOT)
    with open(os.path.join(where, "stderr.txt"), "w+") as err:
        proc = subprocess.Popen(
            command(kind),
            cwd=where,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=err,
            preexec_fn=_unlimited_cores,
            start_new_session=True,
        )
        try:
            code: int | str = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            code = "timeout"
        err.seek(0)
        return code, err.read()


# ----- the stress ---------------------------------------------------------------------------------
def busy_loops(n: int) -> list[subprocess.Popen]:
    """`n` busy-loop processes (each ends when this process does, however it ends)."""
    loop = f"import os\nwhile os.getppid() == {os.getpid()}: pass"
    return [subprocess.Popen([sys.executable, "-c", loop]) for _ in range(n)]


def stress(kinds: list[str], runs: int, load: int, out: str, timeout: float, quiet: bool = False) -> dict:
    """Run every kind `runs` times; {kind: {runs, failures, codes, wall_s, failed: [dir, ...]}}."""
    os.makedirs(out, exist_ok=True)
    loads = busy_loops(load)
    results: dict[str, dict] = {}
    try:
        for kind in kinds:
            codes: collections.Counter = collections.Counter()
            failed: list[str] = []
            held = 0  # runs whose exit handler said a closed group was still referenced (strategies/group_exit.py)
            t0 = time.perf_counter()
            for i in range(runs):
                where = tempfile.mkdtemp(prefix=f"{kind}-{i:03d}-", dir=out)
                code, stderr = run_once(kind, where, timeout)
                codes[str(code)] += 1
                held += "[tandem] at exit" in stderr
                print("." if code == 0 else "F", end="", file=sys.stderr, flush=True)
                if code == 0:
                    shutil.rmtree(where, ignore_errors=True)
                    continue
                failed.append(where)
                cores = [f for f in os.listdir(where) if f.startswith("core")]
                print(
                    f"\n--- {kind} run {i}: exit {code}, kept {where} (core files: {cores or 'none'})\n"
                    + "\n".join(stderr.splitlines()[-25:]),
                    file=sys.stderr,
                    flush=True,
                )
            wall = time.perf_counter() - t0
            results[kind] = dict(
                runs=runs,
                failures=len(failed),
                held=held,
                codes=dict(codes),
                wall_s=round(wall, 1),
                failed=failed,
            )
            if not quiet:
                print(file=sys.stderr)
                print(
                    f"{kind:<13} {runs:>5} runs  {len(failed):>3} non-zero  {held:>3} held groups  {wall:7.1f} s  "
                    f"{dict(codes)}"
                )
                sys.stdout.flush()
    finally:
        for p in loads:
            p.kill()
            p.wait()
    return results


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fit", choices=KINDS, help="run one short fit of this kind (what each run executes)")
    p.add_argument("--runs", type=int, default=100, help="runs per kind (default 100)")
    p.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated, of {', '.join(KINDS)}")
    p.add_argument("--load", type=int, default=1, help="busy-loop processes running meanwhile (default 1)")
    p.add_argument("--out", default=None, help="where failed runs are kept (default: a new temp dir)")
    p.add_argument("--timeout", type=float, default=180.0, help="seconds before a run counts as hung")
    p.add_argument("--json", default=None, help="write the results here")
    args = p.parse_args()
    if args.fit:
        fit(args.fit)
        return 0
    kinds = [k for k in args.kinds.split(",") if k]
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        p.error(f"unknown kinds {unknown}; choose from {', '.join(KINDS)}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped stress still ends its busy loops
    out = args.out or tempfile.mkdtemp(prefix="stress-exits-")
    with open("/proc/sys/kernel/core_pattern") as f:
        pattern = f.read().strip()
    print(f"[stress] {args.runs} runs each of {kinds}, {args.load} busy loop(s); failed runs kept in {out}")
    print(f"[stress] core_pattern {pattern!r} (a plain name: cores land in each run's directory)")
    results = stress(kinds, args.runs, args.load, out, args.timeout)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(results=results, load=args.load, core_pattern=pattern), f, indent=1)
    return 1 if any(r["failures"] for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
