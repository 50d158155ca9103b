"""How long training stalls per checkpoint: AsyncCheckpointIO against a synchronous save, side by side in one run.

The same task (an MLP of 6 Linear(4096, 4096) layers: 100.7M parameters, 403 MB in fp32; AdamW, so a
checkpoint holds 1.2 GB with the optimizer's moments) trains through the Trainer for `--steps` steps with a
ModelCheckpoint every `--every` steps (save_top_k=1: each save also deletes the previous file), in fresh
processes, contenders in alternating order over `--rounds` rounds:

- ``none``: no checkpoints (the baseline),
- ``sync``: the default TorchCheckpointIO (torch.save to a temporary file, fsync, rename),
- ``async``: ``plugins=[AsyncCheckpointIO(writer_nice=19)]`` (its writer thread at nice 19),
- ``async_nice0``: ``plugins=[AsyncCheckpointIO()]`` (the default: the writer at the process's priority),
and with ``--fsdp`` the same under ``strategy="fsdp", devices=2`` (sharded directories: DCP's save against
the plugin's background ``dcp.save``): ``fsdp_none``, ``fsdp_sync``, ``fsdp_async``, ``fsdp_async_nice0``
(``--variants`` picks which async ones run).

The stall per checkpoint is (training time with checkpoints - training time without) / checkpoints, where the
training time runs from the end of the first step to the end of the last one, so that a background write's
cost to the steps it overlaps is included; the wait for the last write at the end of fit is reported apart
("end wait"). The other measure of the stall is the time the training thread is blocked in each save call
("blocked": the whole write when synchronous, the host copy when async), from a timing wrapper around
ModelCheckpoint's write; the first async save also allocates the host buffers the later ones copy into, so it
is shown apart. Third, within each run ("in run"): the steps that ended with a save call or ran while its write
was in flight, minus the run's median step without either, per save (all saves, and the later ones), which does not
depend on another run's load. Under fsdp every rank is timed ("slowest rank": per save, the longest any rank was in the call; a
sharded save is collective, so the slowest rank sets the pace); the other columns are rank 0's. Each background write's wall time and the CPU time its thread used are recorded too (the
writer's demand on the cores that training also uses).

A second table gives the time of one training step (median over every round), by what the checkpoint plugin
was doing: a step that ends with a save call ("save": the whole write when synchronous, the host copy when
async), a step during which a background write was in flight ("in flight"), and the others ("clean").

Prints a table and writes benchmarks/results/async_checkpoint.json. Run it alone (under the shared lock):
    python benchmarks/async_checkpoint.py [--rounds 2] [--steps 13] [--every 3] [--fsdp [--no-single]] [--width N]
        [--variants async,async_nice0] [--more]
(the file's name says which: async_checkpoint[_fsdp][_only][_widthN].json; it is rewritten after every run; --more
adds --rounds rounds to the rounds that file holds, the order alternating on; --tables FILE recomputes the tables).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
WIDTH, LAYERS, BATCH = 4096, 6, 16


def _timed_writes(writes: list[list[float]]) -> None:
    """Record each background write's wall and thread CPU time (in the writer thread: a file's torch.save, a
    directory's dcp.save and publication)."""
    from strategies.checkpoint import async_io

    def timed(fn):
        def run(*args, **kwargs):
            w0, c0 = time.perf_counter(), time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                writes.append([time.perf_counter() - w0, time.thread_time() - c0])

        return run

    async_io.AsyncCheckpointIO._write_file = staticmethod(timed(async_io.AsyncCheckpointIO._write_file))
    async_io._save_dir = timed(async_io._save_dir)


def _child(contender: str, steps: int, every: int, out: str, workdir: str, width: int) -> None:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from callbacks import Callback, ModelCheckpoint
    from trainer import Task, Trainer
    from trainer.plugins import AsyncCheckpointIO

    writes: list[list[float]] = []
    _timed_writes(writes)

    class Big(Task):
        def __init__(self) -> None:
            super().__init__()
            self.layers = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(LAYERS)])

        def training_step(self, batch, batch_idx):
            (x,) = batch
            return self.layers(x).square().mean()

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-5)

    class Clock(Callback):
        """Each step's end, and what the checkpoint plugin was doing during the step before it."""

        def __init__(self) -> None:
            self.ends: list[float] = []
            self.saves: list[float] = []
            self.save_cpu: list[float] = []  # the training thread's CPU time in each save call
            self.kinds: list[str] = []  # per step after the first: "save", "in flight" or "clean"
            self._saved = False  # a save call ended the previous step
            self._busy = False  # a background write was in flight at some point of this step

        def _writing(self, trainer) -> bool:
            writes = getattr(trainer.strategy.checkpoint_io, "_writes", [])
            return any(not w.done.done() for w in writes)

        def on_train_batch_start(self, trainer, task, batch, batch_idx):
            self._busy = self._writing(trainer)

        def on_train_batch_end(self, trainer, task, outputs, batch, batch_idx):
            self.ends.append(time.perf_counter())  # (before ModelCheckpoint's save: this callback is first)
            if len(self.ends) > 1:
                busy = self._busy or self._writing(trainer)
                self.kinds.append("save" if self._saved else "in flight" if busy else "clean")
            self._saved = False

    clock = Clock()
    ckpt = ModelCheckpoint(dirpath=os.path.join(workdir, "ckpt"), every_n_train_steps=every, save_top_k=1)
    save = ckpt._write  # the time each save keeps the training loop waiting, measured around the call

    def timed(trainer, path):
        t0, c0 = time.perf_counter(), time.thread_time()
        save(trainer, path)
        clock.saves.append(time.perf_counter() - t0)
        clock.save_cpu.append(time.thread_time() - c0)
        clock._saved = True

    ckpt._write = timed
    fsdp = contender.startswith("fsdp")
    kind = contender.removeprefix("fsdp_")
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(BATCH * steps * (2 if fsdp else 1), width))
    trainer = Trainer(
        max_steps=steps,
        accelerator="cpu",
        strategy="fsdp" if fsdp else "single",
        devices=2 if fsdp else 1,
        callbacks=[clock] + ([ckpt] if kind != "none" else []),
        plugins=[AsyncCheckpointIO(writer_nice=19 if kind == "async" else None)]
        if kind.startswith("async")
        else None,
        enable_checkpointing=kind != "none",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=workdir,
    )
    t0 = time.perf_counter()
    trainer.fit(Big(), DataLoader(data, batch_size=BATCH))
    fit_end = time.perf_counter()
    if trainer.is_global_zero:
        result = {
            "train_s": clock.ends[-1] - clock.ends[0],
            "end_wait_s": fit_end - clock.ends[-1],
            "saves": len(clock.saves),
            "in_call_s": clock.saves,
            "in_call_cpu_s": clock.save_cpu,
            "writes_s": writes,  # [wall, writer thread CPU] per background write
            "step_s": [b - a for a, b in zip(clock.ends, clock.ends[1:])],
            "step_kinds": clock.kinds,
            "fit_s": fit_end - t0,
            "loadavg_end": os.getloadavg(),  # (the machine's other work during the run)
            "params": LAYERS * (width * width + width),
        }
        with open(out, "w") as f:
            json.dump(result, f)
    else:  # every other rank's time in each save call (a sharded save blocks every rank; the slowest sets the pace)
        with open(f"{out}.rank{trainer.global_rank}", "w") as f:
            json.dump({"in_call_s": clock.saves, "in_call_cpu_s": clock.save_cpu}, f)


def _run(contender: str, args: argparse.Namespace) -> dict:
    workdir = tempfile.mkdtemp(prefix=f"tandem-async-bench-{contender}-", dir=args.dir)
    out = os.path.join(workdir, "result.json")
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        contender,
        "--out",
        out,
        "--workdir",
        workdir,
    ]
    cmd += ["--steps", str(args.steps), "--every", str(args.every), "--width", str(args.width)]
    try:
        subprocess.run(cmd, check=True, env={**os.environ, "OMP_NUM_THREADS": "2"})
        with open(out) as f:
            result = json.load(f)
        ranks = sorted(glob.glob(f"{out}.rank*"), key=lambda name: int(name.rsplit("rank", 1)[1]))
        if ranks:  # rank 0's calls, then each other rank's
            result["in_call_s_ranks"] = [result["in_call_s"]]
            for name in ranks:
                with open(name) as f:
                    result["in_call_s_ranks"].append(json.load(f)["in_call_s"])
        return result
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--steps", type=int, default=13)
    p.add_argument("--every", type=int, default=3)
    p.add_argument("--fsdp", action="store_true", help="also fsdp at 2 processes (sharded directories)")
    p.add_argument("--no-single", action="store_true", help="fsdp only (with --fsdp)")
    p.add_argument(
        "--width", type=int, default=WIDTH, help="of the layers (4096: 403 MB; smaller for a smoke run)"
    )
    p.add_argument(
        "--variants",
        default="async,async_nice0",
        help="the async contenders (async: writer at nice 19, async_nice0)",
    )
    p.add_argument("--dir", default=None, help="where checkpoints are written (default: the system's temp)")
    p.add_argument(
        "--tables", default=None, help="only print and write the tables of the runs in this results file"
    )
    p.add_argument(
        "--more",
        action="store_true",
        help="add --rounds rounds to this run's results file (order alternating on)",
    )
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    p.add_argument("--workdir", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        _child(args.child, args.steps, args.every, args.out, args.workdir, args.width)
        return
    variants = [v for v in args.variants.split(",") if v]
    groups = [] if args.no_single and args.fsdp else [["none", "sync", *variants]]
    groups += [["fsdp_none", "fsdp_sync", *[f"fsdp_{v}" for v in variants]]] if args.fsdp else []
    os.makedirs(RESULTS, exist_ok=True)
    name = "async_checkpoint" + ("_fsdp" if args.fsdp else "") + ("_only" if args.no_single else "")
    name += "" if args.width == WIDTH else f"_width{args.width}"
    result = os.path.join(RESULTS, f"{name}.json")
    runs: dict[str, list[dict]] = {}
    rounds = args.rounds
    if args.tables:  # the runs a stopped (or finished) benchmark left: every contender with a run
        with open(args.tables) as f:
            saved = json.load(f)
        runs = saved["runs"]
        groups = [[c for c in group if c in runs] for group in groups]
        groups = [g for g in groups if len(g) > 1 and g[0] in runs]
        result, rounds = args.tables, 0
        args = argparse.Namespace(
            **{**saved["args"], "tables": None, "more": False, "rounds_done": max(map(len, runs.values()))}
        )
    first = 0
    if args.more and os.path.exists(result):  # the rounds this file holds, then --rounds more
        with open(result) as f:
            runs = json.load(f)["runs"]
        first = min(len(runs.get(c, [])) for group in groups for c in group)
    for r in range(first, first + rounds):
        for group in groups:
            for contender in group if r % 2 == 0 else reversed(group):
                runs.setdefault(contender, []).append(_run(contender, args))
                print(f"round {r}: {contender}: {runs[contender][-1]['train_s']:.2f} s", flush=True)
                with open(result, "w") as f:  # every run kept as it ends (the tables follow at the end)
                    json.dump({"args": vars(args), "runs": runs}, f, indent=1)
    rows = []
    for group in groups:
        base = statistics.median(x["train_s"] for x in runs[group[0]])
        stalls, blocked, blocked_slowest, stalls_within, later_within = {}, {}, {}, {}, {}
        for contender in group[1:]:
            per = [(x["train_s"] - base) / x["saves"] for x in runs[contender]]
            first = [x["in_call_s"][0] for x in runs[contender]]
            later = [s for x in runs[contender] for s in x["in_call_s"][1:]]
            every_call = [s for x in runs[contender] for s in x["in_call_s"]]
            # per save, the longest any rank was blocked in it (one process: rank 0's own)
            slowest = [
                list(map(max, zip(*x.get("in_call_s_ranks", [x["in_call_s"]])))) for x in runs[contender]
            ]
            slowest_later = [s for calls in slowest for s in calls[1:]]
            written = [w for x in runs[contender] for w in x.get("writes_s", [])]
            # the saves' cost to the steps of the same run: each step that ended with a save call or ran while a
            # write was in flight, minus that run's median clean step (the machine's load drifts between runs)
            extras = [e for e in map(_within_run, runs[contender]) if e]
            within = [sum(e) / x["saves"] for e, x in zip(extras, runs[contender])]
            within_later = [t for e in extras for t in e[1:]]  # (the first save also allocates the host copy)
            if within:
                stalls_within[contender] = statistics.median(within)
            if within_later:
                later_within[contender] = statistics.median(within_later)
            stalls[contender] = statistics.median(per)
            blocked[contender] = statistics.median(later or every_call)
            blocked_slowest[contender] = statistics.median(slowest_later or [s for c in slowest for s in c])
            rows.append(
                {
                    "contender": contender,
                    "stall_per_checkpoint_s": statistics.median(per),
                    "per_round": per,
                    "stall_within_run_s": stalls_within.get(contender),
                    "within_run_per_round": within,
                    "stall_within_run_later_s": later_within.get(contender),
                    "within_run_per_save": extras,
                    "in_call_first_s": statistics.median(first),
                    "in_call_later_s": statistics.median(later) if later else None,
                    "in_call_later_slowest_rank_s": statistics.median(slowest_later)
                    if slowest_later
                    else None,
                    "in_call_cpu_s": statistics.median(
                        c for x in runs[contender] for c in x["in_call_cpu_s"]
                    ),
                    "write_wall_s": statistics.median(w[0] for w in written) if written else None,
                    "write_cpu_s": statistics.median(w[1] for w in written) if written else None,
                    "end_wait_s": statistics.median(x["end_wait_s"] for x in runs[contender]),
                    "saves": runs[contender][0]["saves"],
                }
            )
        sync = group[1]
        for contender in group[2:]:
            rows.append(
                {
                    "contender": f"{contender} / {sync}",
                    "ratio": stalls[contender] / stalls[sync] if stalls[sync] > 0 else None,
                    "blocked_ratio": blocked[contender] / blocked[sync] if blocked[sync] > 0 else None,
                    "within_run_ratio": stalls_within[contender] / stalls_within[sync]
                    if stalls_within.get(sync, 0) > 0 and contender in stalls_within
                    else None,
                    "within_run_later_ratio": later_within[contender] / later_within[sync]
                    if later_within.get(sync, 0) > 0 and contender in later_within
                    else None,
                    "blocked_slowest_rank_ratio": blocked_slowest[contender] / blocked_slowest[sync]
                    if blocked_slowest[sync] > 0
                    else None,
                }
            )
    params = runs[groups[0][0]][0]["params"]
    print(
        f"\nmodel: {params} parameters, {params * 4 / 1e6:.0f} MB fp32; AdamW; {args.steps} steps, every {args.every}"
    )
    print(
        f"{'contender':<24}{'stall/ckpt s':>14}{'in run s':>10}{'later s':>9}{'blocked 1st s':>15}{'blocked later s':>17}"
        f"{'slowest rank s':>16}{'write wall s':>14}{'write cpu s':>13}{'end wait s':>12}"
    )

    def cell(v: float | None, width: int) -> str:
        return f"{'-' if v is None else f'{v:.2f}':>{width}}"

    for row in rows:
        if "ratio" in row:
            print(
                f"{row['contender']:<24}{cell(row['ratio'], 14)}{cell(row['within_run_ratio'], 10)}"
                f"{cell(row['within_run_later_ratio'], 9)}"
                f"{cell(row['blocked_ratio'], 15)}"
                f"{cell(row['blocked_slowest_rank_ratio'], 17)}"
                "   (ratios: end-to-end, in the run's steps (all, later saves), blocked in the call, slowest rank)"
            )
            continue
        print(
            f"{row['contender']:<24}{cell(row['stall_per_checkpoint_s'], 14)}{cell(row['stall_within_run_s'], 10)}"
            f"{cell(row['stall_within_run_later_s'], 9)}"
            f"{cell(row['in_call_first_s'], 15)}"
            f"{cell(row['in_call_later_s'], 17)}{cell(row['in_call_later_slowest_rank_s'], 16)}"
            f"{cell(row['write_wall_s'], 14)}{cell(row['write_cpu_s'], 13)}"
            f"{cell(row['end_wait_s'], 12)}"
        )
    steps = _step_table(groups, runs)
    with open(result, "w") as f:
        json.dump(
            {"args": vars(args), "runs": runs, "rows": rows, "steps": steps, "params": params}, f, indent=1
        )


def _within_run(run: dict) -> list[float] | None:
    """Per save, the time its steps took beyond the run's median clean step: the step that ended with the save call
    and the steps during which its write was still in flight."""
    clean = [t for t, kind in zip(run["step_s"], run["step_kinds"]) if kind == "clean"]
    if not clean or not run["saves"]:
        return None
    base, extra = statistics.median(clean), []
    for t, kind in zip(run["step_s"], run["step_kinds"]):
        if kind == "save":
            extra.append(t - base)
        elif kind == "in flight" and extra:
            extra[-1] += t - base
    return extra


def _step_table(groups: list[list[str]], runs: dict[str, list[dict]]) -> list[dict]:
    """The time of one training step, median over every round's steps of each kind: a step that ends with a
    save call ("save": the whole write when synchronous, the host copy when async), a step while a background
    write is in flight ("in flight"), and the other steps ("clean"); each also as a ratio to no checkpoints."""
    rows = []
    print(f"\n{'per step (median)':<24}{'clean s':>10}{'save s':>10}{'in flight s':>13}{'n in flight':>13}")
    for group in groups:
        base = statistics.median(t for x in runs[group[0]] for t in x["step_s"])
        for contender in group:
            by: dict[str, list[float]] = {"clean": [], "save": [], "in flight": []}
            for x in runs[contender]:
                for t, kind in zip(x["step_s"], x["step_kinds"] or ["clean"] * len(x["step_s"])):
                    by[kind].append(t)
            row = {"contender": contender, "baseline_step_s": base, "n_in_flight": len(by["in flight"])}
            for kind, times in by.items():
                row[f"{kind.replace(' ', '_')}_s"] = statistics.median(times) if times else None
            rows.append(row)
            cells = [row["clean_s"], row["save_s"], row["in_flight_s"]]
            shown = [f"{c:.3f}" if c is not None else "-" for c in cells]
            print(f"{contender:<24}{shown[0]:>10}{shown[1]:>10}{shown[2]:>13}{row['n_in_flight']:>13}")
    return rows


if __name__ == "__main__":
    main()
