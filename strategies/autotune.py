"""bucket_cap_mb="auto": measure backward and the link, pick buckets with the cost model, try them, keep or go back.

The Reducer starts with 25 MB buckets and feeds an AutoTuner what it sees:

1. measuring: for AUTO_ITERATIONS synchronised backwards (the first is a warm-up), when each gradient is
   ready, the time between two backwards, and how long backward + finalize took;
2. plan: all-reduce probes of two sizes (three on a fast link), alone (alpha, beta) and while a matmul
   loop runs on the same rank (the CPU share of an all-reduce and backward's speed next to one, on CPU
   only); rank 0 picks the layout with the cost model (strategies/costmodel.py) and broadcasts it, every
   rank builds it;
3. trial: if the layout changed, TRIAL_ITERATIONS backwards alternate between the new buckets and the
   25 MB ones (both kept allocated meanwhile: one more copy of the gradients for those steps). Each new
   backward is compared with the 25 MB one right after it, under the same load; rank 0 keeps the new
   buckets only if they were faster (backward + finalize) in at least TRIAL_WINS of the 5 pairs and in
   median, and every rank follows; a tie goes to the 25 MB buckets. Nothing changes after the first
   AUTO_ITERATIONS + TRIAL_ITERATIONS synchronised backwards.

What it measured and decided is `reducer.auto` (AutoBuckets), logged once on rank 0.
"""

from __future__ import annotations

import logging
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist

from strategies.buckets import AutoBuckets, BucketLayout, assign_buckets
from strategies.comm_device import to_comm
from strategies.costmodel import LinkCost, choose_buckets, predict
from strategies.timing import Timer, timer_for

_MB = 1024 * 1024
AUTO_ITERATIONS = 4  # backwards measured with 25 MB buckets (the first is a warm-up) before the plan
TRIAL_ITERATIONS = 10  # backwards alternating between the chosen buckets and the 25 MB ones: 5 pairs
TRIAL_WINS = 4  # pairs in which the chosen buckets must be the faster (and faster in median) to be kept
PROBE_BYTES = (4096, 4 * _MB)  # all-reduce sizes whose times give alpha and beta
PROBE_REPEATS = 5
FAST_S = 0.02  # a 4 MB all-reduce faster than this: probe the gradients' whole size too
OVERLAP_REPEATS = 3
# the model must predict a step at least this much faster than with 25 MB buckets before a trial: smaller
# predicted gains are within its error (docs/benchmarks.md), and a trial of a slower layout costs steps
AUTO_MIN_GAIN = 0.03
_log = logging.getLogger("strategies.reducer")


class AutoTuner:
    """The measurements and decisions of bucket_cap_mb="auto" for one Reducer. Times are marks of `timer`
    (the device's clock: CUDA events on a GPU, strategies/timing.py), turned into seconds when a decision
    needs them (after the measured backwards and after the trial: reading CUDA events waits for them)."""

    def __init__(
        self,
        process_group: dist.ProcessGroup | None,
        src: int,
        world_size: int,
        n: int,
        device: torch.device | None = None,
        timer: Timer | None = None,
    ) -> None:
        self.group, self.src, self.world_size, self.n = process_group, src, world_size, n
        self.device = device or torch.device(
            "cpu"
        )  # the communication device: probes and messages live there
        self.timer = timer or timer_for(self.device)
        # per measured backward: its start mark and, per parameter, the mark when its gradient was ready
        self.ready_times: list[tuple[Any, list[Any]]] = []
        self.outside: list[tuple[Any, Any]] = []  # (end of one finalize, next prepare_for_backward)
        self.sync_s: list[tuple[Any, Any]] = []  # per backward: (prepare_for_backward, end of finalize)
        self.finalized_at: Any = None
        self.result: AutoBuckets | None = None
        self.trial: list[BucketLayout] = []  # during the trial: the chosen layout, the 25 MB one
        self.trial_s: tuple[list[Any], list[Any]] = ([], [])  # their (start, end) marks

    @property
    def timing(self) -> bool:
        """Whether the next backward is measured (before the plan, and during the trial)."""
        return self.result is None or bool(self.trial)

    def begin(self, t0: Any, measuring: bool) -> None:
        """A synchronised backward starts at mark t0."""
        if measuring:
            self.ready_times.append((t0, [None] * self.n))
            if self.finalized_at is not None:
                self.outside.append((self.finalized_at, t0))

    def ready(self, i: int, mark: Any) -> None:
        """Parameter i's gradient became ready at `mark` (while measuring)."""
        self.ready_times[-1][1][i] = mark

    def end(self, t0: Any, layout: BucketLayout, mark: Any = None) -> BucketLayout:
        """Finalize ended at `mark`; returns the layout for the next backward (during the trial: the other one)."""
        if not self.timing:  # decided: nothing more to measure
            return layout
        self.finalized_at = mark if mark is not None else self.timer.mark()
        if self.result is None:
            self.sync_s.append((t0, self.finalized_at))
            return layout
        self.trial_s[self.trial.index(layout)].append((t0, self.finalized_at))
        done = len(self.trial_s[0]) + len(self.trial_s[1])
        if done < TRIAL_ITERATIONS:
            return self.trial[done % 2]
        return self._verdict()

    def _seconds(self, spans: list[tuple[Any, Any]]) -> list[float]:
        return [self.timer.seconds(a, b) for a, b in spans]

    def _ready_seconds(self) -> list[list[float]]:
        nan = float("nan")
        return [
            [nan if m is None else self.timer.seconds(t0, m) for m in marks] for t0, marks in self.ready_times
        ]

    def plan(self, order: list[int], layout: BucketLayout) -> BucketLayout:
        """Probe the link, let rank 0 choose the buckets, build them on every rank; returns the layout for
        the next backward: the chosen one, on trial, or the 25 MB one in rank 0's gradient order."""
        n, nan, device = self.n, float("nan"), self.device
        probes, cpu, rate = self._probe(device, sum(layout.sizes))
        small, large = min(probes), max(probes)
        cost = LinkCost.fit((small, probes[small]), (large, probes[large]), self.world_size)
        small, large = PROBE_BYTES
        cost = cost.with_cpu((small, cpu[small]), (large, cpu[large]), self.world_size, rate)
        ready_times = self._ready_seconds()
        measured = ready_times[1:] or ready_times  # the first backward is a warm-up
        # per parameter the median over the measured backwards; never ready (unused): end of backward
        ready = [statistics.median([r[i] for r in measured if r[i] == r[i]] or [nan]) for i in range(n)]
        backward = max((t for t in ready if t == t), default=0.0)
        ready = [backward if t != t else t for t in ready]
        sizes, keys = layout.sizes, layout.keys
        outside = statistics.median(self._seconds(self.outside)) if self.outside else 0.0
        sync_s = self._seconds(self.sync_s)
        sync = statistics.median(sync_s[1:] or sync_s)
        # one broadcast from rank 0 carries everything the ranks must agree on
        plan = torch.zeros(4 * n + 8, dtype=torch.float64, device=device)
        if dist.get_rank(self.group) == 0:
            fixed = assign_buckets(sizes, keys, order, layout.first_cap, layout.cap)
            buckets = choose_buckets(
                ready, sizes, order, cost, self.world_size, keys, fixed, outside, AUTO_MIN_GAIN
            )
            plan[:n] = torch.tensor(order, dtype=torch.float64)
            plan[n : 2 * n] = torch.tensor([i for b in buckets for i in b], dtype=torch.float64)
            plan[2 * n : 3 * n] = torch.tensor(
                [k for k, b in enumerate(buckets) for _ in b], dtype=torch.float64
            )
            plan[3 * n : 4 * n] = torch.tensor(ready, dtype=torch.float64)
            numbers = [cost.alpha, cost.beta, cost.cpu_alpha, cost.cpu_beta, cost.compute_rate]
            plan[4 * n :] = torch.tensor([*numbers, outside, sync, len(buckets)], dtype=torch.float64)
        dist.broadcast(plan, src=self.src, group=self.group)
        values = plan.tolist()
        order, flat = [int(v) for v in values[:n]], [int(v) for v in values[n : 2 * n]]
        owner, ready = [int(v) for v in values[2 * n : 3 * n]], values[3 * n : 4 * n]
        *numbers, outside, sync, count = values[4 * n :]
        buckets: list[list[int]] = [[] for _ in range(int(count))]
        for i, k in zip(flat, owner):
            buckets[k].append(i)
        cost = LinkCost(*numbers)
        layout.build(order)  # the 25 MB buckets in rank 0's order, as the reducer's one rebuild
        fixed = layout.indices
        self.result = AutoBuckets(
            alpha_s=cost.alpha,
            beta_s=cost.beta,
            cpu_alpha_s=cost.cpu_alpha,
            cpu_beta_s=cost.cpu_beta,
            compute_rate=cost.compute_rate,
            probes=probes,
            probes_cpu_s=cpu,
            ready_s=ready,
            backward_s=max(ready),
            outside_s=outside,
            buckets=buckets,
            bucket_mb=[sum(sizes[i] for i in b) / _MB for b in buckets],
            predicted_step_s=predict(ready, sizes, buckets, cost, self.world_size, outside).step_s,
            predicted_step_s_cap25=predict(ready, sizes, fixed, cost, self.world_size, outside).step_s,
            kept_cap25=buckets == fixed,
            sync_s_cap25=sync,
        )
        self.ready_times, self.outside = [], []
        if self.result.kept_cap25:
            self._report()
            return layout
        self.trial = [layout.sibling(buckets), layout]
        return self.trial[0]

    def _verdict(self) -> BucketLayout:
        """Rank 0 compares the two layouts pair by pair; every rank keeps the winner and drops the other."""
        assert self.result is not None
        trial_s = [self._seconds(spans) for spans in self.trial_s]
        wins = sum(n < o for n, o in zip(*trial_s))  # each pair ran back to back, under the same load
        new, old = (statistics.median(times) for times in trial_s)
        keep = wins >= TRIAL_WINS and new < old
        decision = to_comm([new, old, float(wins), float(keep)], self.device, torch.float64)
        dist.broadcast(decision, src=self.src, group=self.group)
        new, old, wins, keep = decision.tolist()
        self.result.sync_s_trial, self.result.sync_s_cap25, self.result.reverted = new, old, not keep
        self.result.trial_wins = int(wins)
        chosen = self.trial[0 if keep else 1]
        self.trial, self.trial_s = [], ([], [])
        self._report()
        return chosen

    def _report(self) -> None:
        if dist.get_rank(self.group) == 0 and self.result is not None:
            _log.info(report(self.result))

    def _probe(self, device: torch.device, total: int) -> tuple[dict[int, float], dict[int, float], float]:
        """Per PROBE_BYTES size: seconds of one all-reduce alone (fastest of a few, after a warm-up) and the
        seconds of it that did not progress while this rank computed; and the compute's speed meanwhile.
        On a fast link (4 MB in under FAST_S) also the gradients' whole size, up to 64 MB: there a 4 MB
        buffer still sits in the CPU's caches, and larger ones went 30% slower in the lab."""
        times, cpu = self._time_allreduces(PROBE_BYTES, device), {}
        whole = min(total, 64 * _MB) // 4 * 4
        if times[PROBE_BYTES[1]] < FAST_S and whole > 2 * PROBE_BYTES[1]:
            times.update(self._time_allreduces((whole,), device))
        if device.type != "cpu":  # an accelerator computes and communicates on its own engines
            return times, {nbytes: 0.0 for nbytes in PROBE_BYTES}, 1.0
        rate = 1.0
        for nbytes in PROBE_BYTES:
            cpu[nbytes], rate = _overlap_probe(times[nbytes], nbytes, self.group, device)
        return times, cpu, rate

    def _time_allreduces(self, sizes: tuple[int, ...], device: torch.device) -> dict[int, float]:
        """Seconds of one all-reduce of each size: the fastest of PROBE_REPEATS rounds after a warm-up one.
        Each round times every size once, so a busy moment on the machine falls on all sizes alike."""
        tensors = {n: torch.zeros(n // 4, dtype=torch.float32, device=device) for n in sizes}
        samples: dict[int, list[float]] = {n: [] for n in sizes}
        timer = timer_for(device)  # on a GPU, events around the all-reduce on the stream that waits for it
        for _ in range(PROBE_REPEATS + 1):
            for n, t in tensors.items():
                start = timer.mark()
                dist.all_reduce(t, group=self.group)
                samples[n].append((start, timer.mark()))
        return {
            n: min(timer.seconds(a, b) for a, b in s[1:]) for n, s in samples.items()
        }  # the minimum: a late peer only ever adds time


def _overlap_probe(
    alone_s: float, nbytes: int, group: dist.ProcessGroup | None, device: torch.device
) -> tuple[float, float]:
    """Run a matmul loop alone and next to an all-reduce of `nbytes` (which takes `alone_s` alone).
    Returns the seconds of the all-reduce that waited for the CPU and the loop's speed next to it (0-1]."""
    w, x = torch.randn(256, 256) * 0.05, torch.randn(64, 256)
    start = time.perf_counter()
    for _ in range(20):
        x = torch.tanh(x @ w)
    one = (time.perf_counter() - start) / 20
    ops = int(min(max(2 * alone_s, 20 * one), 0.05) / one) + 1  # about twice the all-reduce, at most 50 ms
    t = torch.zeros(nbytes // 4, device=device)  # (the CPU: only run where the host does the work)
    alone, together, finished = [], [], []
    for _ in range(OVERLAP_REPEATS):
        dist.barrier(group=group)
        start = time.perf_counter()
        for _ in range(ops):
            x = torch.tanh(x @ w)
        alone.append(time.perf_counter() - start)
        dist.barrier(group=group)
        start, done = time.perf_counter(), None
        work = dist.all_reduce(t, group=group, async_op=True)
        for _ in range(ops):
            x = torch.tanh(x @ w)
            if done is None and work.is_completed():
                done = time.perf_counter() - start
        together.append(time.perf_counter() - start)
        work.wait()
        finished.append(done if done is not None else time.perf_counter() - start)
    d, d2, c = statistics.median(alone), statistics.median(together), statistics.median(finished)
    if c >= d2:  # the all-reduce outlived the loop: it progressed (alone_s - (c - d2)) during d2
        progressed, rate = max(0.0, alone_s - (c - d2)) / d2, d / d2
    else:  # it ended first: the loop ran c seconds next to it and d2 - c alone
        progressed, rate = alone_s / c, (d - (d2 - c)) / c
    return (1.0 - min(progressed, 1.0)) * alone_s, min(max(rate, 0.05), 1.0)


def report(result: AutoBuckets) -> str:
    """One line: what auto measured, chose, and whether the trial kept it."""
    a = result
    if a.kept_cap25:
        outcome = f"kept 25 MB buckets (predicted gain under {AUTO_MIN_GAIN:.0%})"
    else:
        verdict = "back to the 25 MB buckets" if a.reverted else "kept"
        outcome = (
            f"trial {a.sync_s_trial * 1e3:.1f} ms against {a.sync_s_cap25 * 1e3:.1f} ms with 25 MB, faster in "
            f"{a.trial_wins} of {TRIAL_ITERATIONS // 2} pairs: {verdict}"
        )
    return (
        f"bucket_cap_mb='auto': all-reduce alpha {a.alpha_s * 1e6:.1f} us, {1e-6 / max(a.beta_s, 1e-15):.1f} MB/s, "
        f"CPU share {a.probes_cpu_s[PROBE_BYTES[0]] * 1e3:.2f}/{a.probes_cpu_s[PROBE_BYTES[1]] * 1e3:.2f} ms, "
        f"backward speed next to it {a.compute_rate:.2f}; backward {a.backward_s * 1e3:.1f} ms; buckets of "
        f"{', '.join(f'{mb:.2f}' for mb in a.bucket_mb)} MB; predicted step {a.predicted_step_s * 1e3:.1f} ms, "
        f"{a.predicted_step_s_cap25 * 1e3:.1f} ms with 25 MB buckets; {outcome}"
    )
