"""The timing harness of benchmarks/overhead.py: contenders take turns in windows, timed in the dataset."""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
from overhead_models import MODELS, run_raw
from torch.utils.data import DataLoader, Dataset


# ----- turn-taking ----------------------------------------------------------------------------------
class Baton:
    """Exactly one party runs at a time; `hand(name)` passes the turn and `wait(name)` blocks for it."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._turn = "main"

    def hand(self, name: str) -> None:
        """Give the turn to `name`."""
        with self._cond:
            self._turn = name
            self._cond.notify_all()

    def wait(self, name: str, timeout: float = 600.0) -> None:
        """Block until it is `name`'s turn."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._turn == name, timeout=timeout):
                raise TimeoutError(f"{name} waited {timeout:.0f} s for its turn")


class Clock:
    """Counts batch fetches; at each window boundary records the window's time and yields the turn."""

    def __init__(self, name: str, baton: Baton, warmup: int, window: int, rounds: int, threads: int) -> None:
        self.name, self.baton, self.threads = name, baton, threads
        self.boundaries = [warmup + j * window for j in range(rounds + 1)]
        self.count, self.start, self.cpu_start = 0, 0.0, 0.0
        self.windows: list[float] = []  # wall-clock seconds
        self.cpu_windows: list[float] = []  # CPU seconds of the whole process (our threads only)

    def tick(self) -> None:
        """One batch fetched: at a window boundary, record the window and pass the turn to main."""
        n, self.count = self.count, self.count + 1
        if n not in self.boundaries:
            return
        now, cpu = time.perf_counter(), time.process_time()
        if n > self.boundaries[0]:
            self.windows.append(now - self.start)
            self.cpu_windows.append(cpu - self.cpu_start)
        if torch.get_num_threads() != self.threads:  # a framework changed it: the comparison would be unfair
            raise RuntimeError(
                f"{self.name}: torch uses {torch.get_num_threads()} threads, not {self.threads}"
            )
        if n == self.boundaries[-1]:
            return  # the last window: finish the run in this turn, then hand back
        self.baton.hand("main")
        self.baton.wait(self.name)
        self.cpu_start, self.start = time.process_time(), time.perf_counter()


class TimedBatches(Dataset):
    """`length` pre-made batches (cycling through a few distinct ones); fetching one ticks the clock."""

    def __init__(self, batches: list[Any], length: int, clock: Clock) -> None:
        self.batches, self.length, self.clock = batches, length, clock

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> Any:
        self.clock.tick()
        return self.batches[i % len(self.batches)]


# ----- one model, all contenders, interleaved -------------------------------------------------------
def measure(
    model_name: str, names: dict[str, Callable[..., None]], args: argparse.Namespace
) -> dict[str, Any]:
    """One run: every contender trains `model_name` in its own thread, in turns; returns their windows."""
    baton = Baton()
    g = torch.Generator().manual_seed(0)
    cls = MODELS[model_name]
    batches = [cls.batch(g) for _ in range(8)]  # type: ignore[attr-defined]
    length = args.warmup + args.rounds * args.window + 2  # +2: Lightning fetches one batch ahead
    clocks: dict[str, Clock] = {}
    errors: dict[str, BaseException] = {}
    threads: dict[str, threading.Thread] = {}
    tmp = tempfile.TemporaryDirectory(prefix="tandem-overhead-")

    def body(name: str, fn: Callable[..., None], clock: Clock) -> None:
        try:
            baton.wait(name)
            torch.set_num_threads(args.threads)
            torch.manual_seed(0)
            loader = DataLoader(TimedBatches(batches, length, clock), batch_size=None)
            fn(cls(), loader, os.path.join(tmp.name, name))
            if len(clock.windows) != args.rounds:
                raise RuntimeError(f"{name} timed {len(clock.windows)} windows, expected {args.rounds}")
        except BaseException as e:  # report to the main thread; never leave it waiting
            errors[name] = e
        finally:
            baton.hand("main")

    # The first thread that trains ran 2-4% slower than later identical ones (seen with the raw-again
    # control on `tiny`; malloc arenas play a part: MALLOC_ARENA_MAX=1 halves it). A pilot thread takes
    # that place and idles, alive, until the contenders are done.
    done = threading.Event()

    def pilot() -> None:
        torch.set_num_threads(args.threads)
        run_raw(cls(), DataLoader(batches * 4, batch_size=None), "")  # type: ignore[arg-type]
        done.wait()

    pilot_thread = threading.Thread(target=pilot, daemon=True, name="pilot")
    pilot_thread.start()
    for name, fn in names.items():
        clocks[name] = Clock(name, baton, args.warmup, args.window, args.rounds, args.threads)
        threads[name] = threading.Thread(target=body, args=(name, fn, clocks[name]), daemon=True, name=name)
        threads[name].start()
    shuffler = random.Random(0)
    for r in range(args.rounds + 1):  # round 0: setup and warm-up of each contender
        order = list(names)
        if r:  # a fresh random order each round: no contender always follows the same one
            shuffler.shuffle(order)
        for name in order:
            if not threads[name].is_alive():  # its data ran out early: it would never hand the turn back
                raise RuntimeError(f"contender {name!r} stopped before its last window on {model_name}")
            baton.hand(name)
            baton.wait("main")
            if name in errors:
                raise RuntimeError(f"contender {name!r} failed on {model_name}") from errors[name]
    for t in threads.values():
        t.join(timeout=600)
    done.set()
    pilot_thread.join(timeout=60)
    tmp.cleanup()
    return {n: {"wall": clocks[n].windows, "cpu": clocks[n].cpu_windows} for n in names}


def summarize(runs: list[dict[str, dict[str, list[float]]]], window: int) -> dict[str, Any]:
    """Per contender: median ms/step and the median over rounds (of all runs) of its ratio to raw's window."""
    wall = {n: [w for run in runs for w in run[n]["wall"]] for n in runs[0]}
    cpu = {n: [w for run in runs for w in run[n]["cpu"]] for n in runs[0]}
    out: dict[str, Any] = {}
    for name in wall:
        ratios = [w / r for w, r in zip(wall[name], wall["raw"])]
        cpu_ratios = [w / r for w, r in zip(cpu[name], cpu["raw"])]
        extra = [(w - r) / window for w, r in zip(wall[name], wall["raw"])]
        cpu_extra = [(w - r) / window for w, r in zip(cpu[name], cpu["raw"])]
        out[name] = {
            "ms_per_step": 1e3 * statistics.median(wall[name]) / window,
            "ratio_to_raw": statistics.median(ratios),
            "ratio_iqr": _iqr(ratios),
            "overhead_us_per_step": 1e6 * statistics.median(extra),
            "cpu_ms_per_step": 1e3 * statistics.median(cpu[name]) / window,
            "cpu_ratio_to_raw": statistics.median(cpu_ratios),
            "cpu_ratio_iqr": _iqr(cpu_ratios),
            "cpu_overhead_us_per_step": 1e6 * statistics.median(cpu_extra),
            "window_s": wall[name],
            "cpu_window_s": cpu[name],
        }
    return out


def _iqr(xs: list[float]) -> list[float]:
    """First and third quartiles (min and max when there are fewer than 4 values)."""
    if len(xs) < 4:
        return [min(xs), max(xs)]
    q = statistics.quantiles(xs, n=4)
    return [q[0], q[2]]
