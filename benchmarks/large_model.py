"""The largest transformer that trains 2 steps at 4 ranks on this machine, per strategy, Tandem and Lightning
2.6 side by side on the same model and API (``trainer.init_module(empty_init=True)``, fp32, AdamW).

A ladder of GPT sizes (d=2048, 16 heads, vocab 8192; 50M parameters a block) is climbed from the rung below 3/4
of a rough estimate until a rung fails (or down from it until one trains); the largest that trained is reported,
as a fraction of the machine's limit (its memory / 16 bytes per parameter: fp32 weights, gradients and AdamW's
two moments, held once). Each rung
runs as 4 fresh processes under torchrun. The machine's memory less a reserve (2.5 GiB: the OS and a floor) is
the rung's budget: the rung fails when its own processes together hold more (proportional set size, shared pages
counted once), whatever else runs on the machine, so contenders measured at different moments of a shared
machine compare. A safety guard stops a rung when the node runs short before that (other work holds the memory):
such a rung is inconclusive and tried again when the memory is back. A rung failing, past its time limit, or
over its budget counts as not trained.

    flock /tmp/tandem-heavy.lock python benchmarks/large_model.py --only tandem:fsdp   # one contender's ladder
    python benchmarks/large_model.py --report        # the table of all, benchmarks/results/large_model.json
    python benchmarks/large_model.py --quick         # tiny rungs (checks that every contender runs)

Contenders: tandem ddp, ddp_zero1, fsdp (its default units), fsdp_blocks (wrap=[Block]: one unit a block, as the
Lightning contender shards it), model_parallel (TP 2 x FSDP 2), pipeline (4 stages, 1F1B);
lightning ddp, model_parallel as FSDP2 (data_parallel_size=4: fully_shard in configure_model; Lightning's
FSDPStrategy needs a GPU), model_parallel (TP 2 x FSDP 2). Lightning has no ZeRO-1 and no pipeline strategy.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "benchmarks", "results", "large_model")
D, HEADS, VOCAB, SEQ, BATCH = 2048, 16, 8192, 16, 4  # BATCH: sequences per rank per step
LADDER = [2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 32]  # blocks
WORLD = 4
CONTENDERS = {  # name -> bytes per parameter the node holds (weights, grads, AdamW), to pick the first rung
    "tandem:ddp": 16 * WORLD,
    "tandem:ddp_zero1": 8 * WORLD + 8,
    "tandem:fsdp": 16,
    "tandem:model_parallel": 16,
    "tandem:pipeline": 16,
    "tandem:fsdp_blocks": 16,
    "lightning:ddp": 16 * WORLD,
    "lightning:model_parallel_fsdp": 16,
    "lightning:model_parallel": 16,
}
RESERVE = 2.5 * 2**30  # the machine's memory less this is a rung's budget: the OS and a floor kept free
FLOOR = 0.75 * 2**30  # the safety guard: a rung is stopped (inconclusive) when the node has less available
BASE = 0.7 * 2**30  # about what one process holds before its model (interpreter, torch, gloo)


def params(layers: int, d: int = D) -> int:
    return layers * (12 * d * d + 13 * d) + 2 * VOCAB * d + VOCAB + 2 * d


def meminfo(field: str) -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise OSError(field)


# ----- a rung: one worker of 4 -------------------------------------------------------------------------------
def worker(contender: str, layers: int, d: int, out: str) -> None:
    sys.path.insert(0, ROOT)
    import warnings

    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, TensorDataset

    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    framework, name = contender.split(":")
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, VOCAB, (BATCH * WORLD * 4, SEQ), generator=g)
    loader = DataLoader(TensorDataset(x, torch.roll(x, -1, dims=1)), batch_size=BATCH)
    quiet = dict(
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False
    )
    start = time.time()
    if framework == "tandem":
        from strategies.fsdp import FSDPStrategy
        from strategies.model_parallel import ModelParallelStrategy
        from strategies.pipeline import PipelineStrategy
        from tests.helpers.plan_models import GPT, Block
        from trainer import Trainer

        strategy = {
            "model_parallel": lambda: ModelParallelStrategy(2, 2),
            "pipeline": PipelineStrategy,
            "fsdp_blocks": lambda: FSDPStrategy(
                wrap=[Block]
            ),  # one unit a block, as Lightning's configure_model
        }.get(name, lambda: name)()
        trainer = Trainer(strategy=strategy, devices=WORLD, accelerator="cpu", max_steps=2, **quiet)
        with trainer.init_module(empty_init=True):
            model = GPT(d=d, heads=HEADS, layers=layers, vocab=VOCAB)
    else:
        import pytorch_lightning as pl
        from pytorch_lightning.strategies import DDPStrategy, ModelParallelStrategy

        from benchmarks.large_model_lightning import LightningGPT

        strategy = {
            "ddp": lambda: DDPStrategy(),
            "model_parallel_fsdp": lambda: ModelParallelStrategy(
                data_parallel_size=WORLD, tensor_parallel_size=1
            ),
            "model_parallel": lambda: ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=2),
        }[name]()
        trainer = pl.Trainer(strategy=strategy, devices=WORLD, accelerator="cpu", max_steps=2, **quiet)
        with trainer.init_module(empty_init=True):
            model = LightningGPT(d=d, heads=HEADS, layers=layers, vocab=VOCAB)
    trainer.fit(model, loader)
    hwm = 0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                hwm = int(line.split()[1]) * 1024
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, {"hwm": hwm, "steps": int(trainer.global_step)})
    if dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump({"ranks": everyone, "seconds": time.time() - start}, f)


def tree(pid: int) -> list[int]:
    """pid and its descendants (torchrun starts each worker in a session of its own, so a process group misses
    them)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def kill_tree(pids: list[int]) -> None:
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def gone(pids: list[int], wait_s: float = 120.0) -> None:
    """Kill the rung's processes and wait until every one has exited: a killed worker frees its pages only as it
    exits, and the next rung's guard would otherwise read the last one's memory."""
    deadline = time.time() + wait_s
    while time.time() < deadline:
        kill_tree(pids)
        if not any(os.path.exists(f"/proc/{p}") and not zombie(p) for p in pids):
            return
        time.sleep(0.2)
    raise SystemExit(f"the rung's processes {pids} did not exit within {wait_s:.0f} s")


def zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return False


def pss(pids: list[int]) -> int:
    """The processes' proportional set size together (a page they share counted once, split between them)."""
    total = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
                        break
        except OSError:
            pass
    return total


def rung(contender: str, layers: int, d: int, limit_s: float) -> dict:
    """Run one rung under torchrun; what happened. The rung fails when its own processes together hold more than
    the budget (the machine's memory less RESERVE), whatever else runs on the machine; it is inconclusive
    (`busy`) when the machine runs short before that (other work holds the memory it would need)."""
    result = os.path.join(OUT, f".rung-{os.getpid()}.json")
    if os.path.exists(result):
        os.remove(result)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={WORLD}", f"--master_port={port}",
           os.path.abspath(__file__), "--worker", contender, str(layers), str(d), result]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    start, lowest, why, busy, peak = time.time(), meminfo("MemAvailable"), None, False, 0
    budget = meminfo("MemTotal") - RESERVE
    # stderr to a file: a pipe nobody reads while the rung runs could fill and block it
    log = open(result + ".err", "w+")
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=log, text=True)  # fmt: skip

    def stop(signum: int, frame: object) -> None:  # this script stopped (a timeout): its rung goes with it
        kill_tree(tree(proc.pid))
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    while proc.poll() is None:
        free, own = meminfo("MemAvailable"), pss(tree(proc.pid))
        lowest, peak = min(lowest, free), max(peak, own)
        if own > budget:
            why = f"over the budget: its processes held {own / 2**30:.2f} GiB of {budget / 2**30:.2f}"
        elif free < FLOOR:
            why, busy = (
                f"machine busy: {free / 2**30:.2f} GiB available with the rung at {own / 2**30:.2f}",
                True,
            )
        elif time.time() - start > limit_s:
            why = f"past {limit_s:.0f} s"
        if why:
            pids = tree(proc.pid)
            kill_tree(pids)
            proc.wait()
            gone(pids)
            break
        time.sleep(0.25)
    log.seek(0)
    err = log.read()
    log.close()
    os.remove(result + ".err")
    out = {"layers": layers, "d": d, "params": params(layers, d), "seconds": time.time() - start,
           "lowest_available_gib": lowest / 2**30, "peak_pss_gib": peak / 2**30, "budget_gib": budget / 2**30,
           "busy": busy}  # fmt: skip
    if why is None and proc.returncode == 0 and os.path.exists(result):
        with open(result) as f:
            got = json.load(f)
        os.remove(result)
        out.update(
            trained=all(r["steps"] == 2 for r in got["ranks"]),
            hwm_gib=[r["hwm"] / 2**30 for r in got["ranks"]],
        )
    else:
        # a worker's own error, not torchrun's ChildFailedError that wraps it
        lines = [ln for ln in err.splitlines() if re.search(r"\w+(Error|Exception): ", ln)]
        own = [ln for ln in lines if "ChildFailedError" not in ln] or lines
        out.update(trained=False, why=why or (own[0][-300:] if own else f"exit status {proc.returncode}"))
    return out


def climb(contender: str, quick: bool) -> dict:
    """The contender's ladder: the first rung from a rough estimate, then the rung its measured memory predicts
    as the largest within the budget, then one rung at a time up to the first that fails (or down to the first
    that trains). A rung stopped because other work took the memory is tried again once the memory is back."""
    available, total = meminfo("MemAvailable"), meminfo("MemTotal")
    budget = total - RESERVE
    if quick:
        rungs, d, limit, start = [1, 2], 256, 300.0, 0
    else:
        estimate = (budget - WORLD * (BASE + 2**30)) / CONTENDERS[contender]
        below = [n for n in LADDER if params(n) <= 0.85 * estimate] or LADDER[:1]
        rungs, d, limit, start = LADDER, D, 1800.0, LADDER.index(below[-1])
    tried: list[dict] = []

    def attempt(i: int) -> dict:
        for _ in range(3):
            got = rung(contender, rungs[i], d, limit)
            if not got["busy"]:
                break
            need, until = got["peak_pss_gib"] * 2**30 + 2 * 2**30, time.time() + 600
            while meminfo("MemAvailable") < need and time.time() < until:
                time.sleep(5)
        tried.append(got)
        print(f"  {contender} {rungs[i]} blocks ({got['params'] / 1e9:.2f} B params): "
              f"{'trained' if got['trained'] else 'failed: ' + got.get('why', '')} in {got['seconds']:.0f} s, "
              f"peak {got['peak_pss_gib']:.2f} GiB", flush=True)  # fmt: skip
        return got

    i = start
    got = attempt(i)
    if got["trained"] and not quick:  # jump to the rung the measured peak predicts, linear in the parameters
        base, grown = WORLD * BASE, got["peak_pss_gib"] * 2**30 - WORLD * BASE
        fits = [j for j in range(len(rungs)) if base + grown * params(rungs[j]) / params(rungs[i]) <= budget]
        if fits and fits[-1] > i + 1:
            i = fits[-1] - 1
    step = 1 if got["trained"] else -1
    first = got["trained"]
    i += step
    while 0 <= i < len(rungs):
        got = attempt(i)
        if got["busy"] or got["trained"] != first:
            break
        i += step
    if (
        first
        and got["trained"] is False
        and not got["busy"]
        and not any(t["trained"] and t["layers"] == rungs[i - 1] for t in tried)
    ):  # jumped past untried rungs: step down from the failure to the first that trains
        i -= 1
        while i >= 0 and not any(t["layers"] == rungs[i] for t in tried):
            if attempt(i)["trained"] or tried[-1]["busy"]:
                break
            i -= 1
    best = max((t["params"] for t in tried if t["trained"]), default=0)
    return {"contender": contender, "largest_params": best, "machine_limit_params": total / 16,
            "fraction": best / (total / 16), "available_at_start_gib": available / 2**30, "budget_gib":
            budget / 2**30, "rungs": tried, "smallest_rung_failed": not any(t["trained"] for t in tried),
            "inconclusive": any(t["busy"] for t in tried)}  # fmt: skip


def report() -> None:
    rows = []
    for path in sorted(glob.glob(os.path.join(OUT, "*.json"))):
        with open(path) as f:
            rows.append(json.load(f))
    limit = rows[0]["machine_limit_params"] if rows else 0
    print(f"largest GPT (d={D}) that trains 2 steps at {WORLD} ranks; machine limit {limit / 1e9:.2f} B parameters "
          "(MemTotal / 16 bytes)")  # fmt: skip
    print(f"{'contender':<32} {'largest (B params)':>18} {'of limit':>9} {'free at start GiB':>18}")
    for r in rows:
        note = " (every rung tried failed)" if r["smallest_rung_failed"] else ""
        note += " (inconclusive: other work took the memory)" if r.get("inconclusive") else ""
        print(f"{r['contender']:<32} {r['largest_params'] / 1e9:>18.2f} {r['fraction']:>9.2f} "
              f"{r['available_at_start_gib']:>18.1f}{note}")  # fmt: skip
    with open(os.path.join(ROOT, "benchmarks", "results", "large_model.json"), "w") as f:
        json.dump({"model": {"d": D, "heads": HEADS, "vocab": VOCAB, "seq": SEQ, "batch_per_rank": BATCH},
                   "results": rows}, f, indent=1)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", action="append", help="contender(s) to climb, e.g. tandem:fsdp (default: all)")
    ap.add_argument("--quick", action="store_true", help="two tiny rungs per contender, nothing written")
    ap.add_argument("--report", action="store_true", help="print and write the table of the ladders climbed")
    ap.add_argument("--worker", nargs=4, metavar=("CONTENDER", "LAYERS", "D", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        contender, layers, d, out = args.worker
        worker(contender, int(layers), int(d), out)
        return
    if args.report:
        report()
        return
    os.makedirs(OUT, exist_ok=True)
    for contender in args.only or list(CONTENDERS):
        if contender not in CONTENDERS:
            raise SystemExit(f"unknown contender {contender!r}; one of {', '.join(CONTENDERS)}")
        got = climb(contender, args.quick)
        if not args.quick:
            with open(os.path.join(OUT, contender.replace(":", "_") + ".json"), "w") as f:
                json.dump(got, f, indent=1)


if __name__ == "__main__":
    main()
