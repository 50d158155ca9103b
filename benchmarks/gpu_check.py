"""`make gpu-check`: what Tandem must do on a GPU (issue 41), checked in one run of at most 8 minutes.

    python benchmarks/gpu_check.py                 # every check on cuda:0; --write-docs fills docs/benchmarks.md
    python benchmarks/gpu_check.py --device cpu    # the dry run: the checks that mean something on a CPU
    python benchmarks/gpu_check.py --only syncs_single,defaults --quick

Each check runs in a process of its own (a fresh CUDA context, a timeout of its own, a crash that stops only
that check) and prints one line: PASS, FAIL or SKIP, its name and its figure. The results go to
benchmarks/results/gpu_check.json (gpu_check_cpu.json for a dry run) with the date, the GPU and torch's
version. Without CUDA and without --device it says so and exits 0.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# the repository first, even before benchmarks/ (sys.path[0] for this script), which holds a strategies.py
sys.path.insert(0, ROOT)
if HERE not in sys.path:
    sys.path.append(HERE)

RESULTS = os.path.join(HERE, "results")
DOCS = os.path.join(ROOT, "docs", "benchmarks.md")
BEGIN, END = "<!-- gpu-check:begin -->", "<!-- gpu-check:end -->"

# name -> ("module:function", keyword arguments, timeout in seconds on a GPU)
CHECKS: dict[str, tuple[str, dict[str, Any], int]] = {
    "defaults": ("gpu_checks:defaults", {}, 60),
    "syncs_single": ("gpu_checks:syncs", {"strategy": "single"}, 60),
    "syncs_ddp1": ("gpu_checks:syncs", {"strategy": "ddp"}, 60),
    "ddp1_equals_single": ("gpu_checks:ddp1_equals_single", {}, 60),
    "sync_dist": ("gpu_checks:sync_dist", {}, 60),
    "autotune_decision": ("gpu_checks:autotune", {}, 60),
    "precision_matrix": ("gpu_checks:precision_matrix", {}, 90),
    "dp_two_replicas": ("gpu_checks_models:dp_two_replicas", {}, 60),
    "model_parallel_pipeline": ("gpu_checks_models:model_parallel_and_pipeline", {}, 90),
    "compile": ("gpu_checks_models:compiled", {}, 150),
    "throughput_peak": ("gpu_checks_models:throughput_peak", {}, 45),
    "fork_with_cuda": ("gpu_checks_models:fork_with_cuda", {}, 90),
    "save_load": ("gpu_checks_models:save_load", {}, 60),
    "exact_resume": ("gpu_checks_models:exact_resume", {}, 60),
    "fsdp_memory": ("gpu_checks_models:fsdp_memory", {}, 60),
    "tokens_per_s": ("gpu_tokens:tokens_per_s", {}, 240),
}


def _call(name: str, device: str, quick: bool) -> dict[str, Any]:
    """Run one check here; its result as plain data."""
    import importlib

    from gpu_checks import Ctx

    target, kwargs, _ = CHECKS[name]
    module, fn = target.split(":")
    check: Callable[..., Any] = getattr(importlib.import_module(module), fn)
    ctx = Ctx(device, quick)
    start = time.perf_counter()
    try:
        result = check(ctx, **kwargs)
        out = {"passed": result.passed, "figure": result.figure, "data": result.data}
    except Exception as e:  # noqa: BLE001 (a check that raises fails, with the reason as its figure)
        out = {"passed": False, "figure": f"{type(e).__name__}: {str(e)[:300]}", "data": {}}
    finally:
        shutil.rmtree(ctx.tmp, ignore_errors=True)
    out["seconds"] = round(time.perf_counter() - start, 1)
    return out


def _isolated(name: str, device: str, quick: bool, timeout: float) -> dict[str, Any]:
    cmd = [sys.executable, os.path.abspath(__file__), "--run-one", name, "--device", device]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, HERE, os.environ.get("PYTHONPATH", "")]))
    try:
        p = subprocess.run(
            cmd + (["--quick"] if quick else []), capture_output=True, text=True, timeout=timeout, env=env
        )
    except subprocess.TimeoutExpired:
        return {"passed": False, "figure": f"timed out after {timeout:.0f} s", "data": {}, "seconds": timeout}
    line = next((x for x in reversed(p.stdout.splitlines()) if x.startswith("RESULT ")), None)
    if line is None:
        tail = (p.stderr or p.stdout).strip().splitlines()[-1:] or [f"exit {p.returncode}"]
        return {"passed": False, "figure": f"crashed: {tail[0][:300]}", "data": {}, "seconds": None}
    return json.loads(line[7:])


def _in_process(name: str, device: str, quick: bool, timeout: float) -> dict[str, Any]:
    def expire(signum: int, frame: Any) -> None:
        raise TimeoutError(f"timed out after {timeout:.0f} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(max(1, int(timeout)))
    try:
        return _call(name, device, quick)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def environment(device: str) -> dict[str, Any]:
    import torch

    gpu = torch.cuda.get_device_name(0) if device == "cuda" else platform.processor() or "CPU"
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "device": gpu,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }


def write_docs(report: dict[str, Any], path: str = DOCS) -> None:
    """Replace the "On a GPU" summary in docs/benchmarks.md (between its markers) with this run's."""
    env = report["environment"]
    rows = [f"Run {env['date']} on {env['device']} (torch {env['torch']}, CUDA {env['cuda']}): "
            f"{report['passed']} passed, {report['failed']} failed, {report['skipped']} skipped.", "",
            "| check | result | figure |", "|---|---|---|"]  # fmt: skip
    for name, r in report["checks"].items():
        verdict = {True: "pass", False: "**fail**", None: "skip"}[r["passed"]]
        rows.append(f"| {name} | {verdict} | {r['figure'].replace('|', '/')} |")
    with open(path) as f:
        text = f.read()
    block = f"{BEGIN}\n" + "\n".join(rows) + f"\n{END}"
    text = re.sub(re.escape(BEGIN) + r".*?" + re.escape(END), lambda _: block, text, flags=re.S)
    with open(path, "w") as f:
        f.write(text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--device", choices=("cuda", "cpu"), help="default: cuda when there is one, else nothing to do"
    )
    p.add_argument("--only", help="comma-separated check names (default: all)")
    p.add_argument("--quick", action="store_true", help="smaller models (the tests' dry run)")
    p.add_argument(
        "--in-process", action="store_true", help="run every check in this process (faster, less isolated)"
    )
    p.add_argument(
        "--write-docs", action="store_true", help="fill docs/benchmarks.md's 'On a GPU' summary (CUDA only)"
    )
    p.add_argument("--out", help="the JSON file (default: benchmarks/results/gpu_check[_cpu].json)")
    p.add_argument("--run-one", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.run_one:
        print("RESULT " + json.dumps(_call(args.run_one, args.device, args.quick), default=str))
        return 0
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else None)
    if device is None:
        print("gpu-check: no CUDA device on this machine, nothing checked (run it where a GPU is lent; "
              "--device cpu runs the dry run)")  # fmt: skip
        return 0
    names = args.only.split(",") if args.only else list(CHECKS)
    unknown = [n for n in names if n not in CHECKS]
    if unknown:
        p.error(f"unknown checks {unknown}; known: {', '.join(CHECKS)}")
    run = _in_process if args.in_process else _isolated
    checks: dict[str, Any] = {}
    for name in names:
        r = checks[name] = run(name, device, args.quick, CHECKS[name][2] * (1 if device == "cuda" else 3))
        verdict = {True: "PASS", False: "FAIL", None: "SKIP"}[r["passed"]]
        print(f"{verdict} {name}: {r['figure']}", flush=True)
    report = {
        "environment": environment(device),
        "checks": checks,
        "passed": sum(r["passed"] is True for r in checks.values()),
        "failed": sum(r["passed"] is False for r in checks.values()),
        "skipped": sum(r["passed"] is None for r in checks.values()),
    }
    out = args.out or os.path.join(RESULTS, "gpu_check.json" if device == "cuda" else "gpu_check_cpu.json")
    with open(out, "w") as f:
        json.dump(report, f, indent=1, default=str)
    if args.write_docs and device == "cuda":
        write_docs(report)
    print(
        f"gpu-check: {report['passed']} passed, {report['failed']} failed, {report['skipped']} skipped -> {out}"
    )
    return 1 if report["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
