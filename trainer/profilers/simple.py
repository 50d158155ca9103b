"""SimpleProfiler: the wall time of each named action (Lightning's ``profiler="simple"``), and PassThroughProfiler,
which records nothing."""

from __future__ import annotations

import contextlib
import math
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainer.profilers.base import Profiler


class SimpleProfiler(Profiler):
    """Wall time per named action, under Lightning's keys: each hook as ``[Callback]<state_key>.<hook>``,
    ``[LightningModule]<class>.<hook>`` or ``[LightningDataModule]<class>.<hook>``, each batch fetch as
    ``[_TrainingEpochLoop].train_dataloader_next`` / ``[_EvaluationLoop].val_next`` (``test_next``) /
    ``[_PredictionLoop].predict_next``, and the loop's ``training_step``, ``backward``, ``optimizer_step``.
    `recorded_durations` holds every duration (seconds) per action, as Lightning's. `extended`: the report
    shows the number of calls and the share of the stage's time too."""

    def __init__(
        self, dirpath: str | Path | None = None, filename: str | None = None, extended: bool = True
    ) -> None:
        super().__init__(dirpath, filename)
        self.recorded_durations: dict[str, list[float]] = defaultdict(list)
        self.current_actions: dict[str, float] = {}
        self.extended = extended
        self.start_time = time.perf_counter()

    @property
    def seconds(self) -> dict[str, float]:
        """Total seconds per action."""
        return {name: math.fsum(d) for name, d in self.recorded_durations.items()}

    @property
    def calls(self) -> dict[str, int]:
        """How many times each action ran."""
        return {name: len(d) for name, d in self.recorded_durations.items()}

    def start(self, action_name: str) -> None:
        """Begin timing `action_name` (a ValueError if it is being timed already)."""
        if action_name in self.current_actions:
            raise ValueError(f"Attempted to start {action_name} which has already started (stop it first)")
        self.current_actions[action_name] = time.perf_counter()

    def stop(self, action_name: str) -> None:
        """End timing `action_name` and record its duration (a ValueError if it was never started)."""
        end = time.perf_counter()
        if action_name not in self.current_actions:
            raise ValueError(
                f"Attempting to stop recording an action ({action_name}) which was never started"
            )
        self.recorded_durations[action_name].append(end - self.current_actions.pop(action_name))

    @contextlib.contextmanager
    def section(self, name: str) -> Iterator[None]:
        start = time.perf_counter()  # (the loop's sections nest and repeat: no start/stop bookkeeping)
        try:
            yield
        finally:
            self.recorded_durations[name].append(time.perf_counter() - start)

    def fetches(self, name: str, iterable: Any) -> Iterator[Any]:
        """`iterable`'s items, each fetch timed under `name` (the last, empty one not counted)."""
        it = iter(iterable)
        durations, clock = self.recorded_durations[name], time.perf_counter
        while True:
            start = clock()
            try:
                item = next(it)
            except StopIteration:
                return
            durations.append(clock() - start)
            yield item

    def summary(self) -> str:
        """A table of the actions, the longest first (mean and total seconds; with `extended`, calls and %)."""
        title = f"{self._stage.upper()} Profiler Report" if self._stage else "Profiler Report"
        if not self.recorded_durations:
            return title
        seconds, calls = self.seconds, self.calls
        elapsed = max(time.perf_counter() - self.start_time, math.fsum(seconds.values()), 1e-12)
        width = max([len(k) for k in seconds] + [6])
        if self.extended:
            lines = [f"{'action':<{width}}  {'mean s':>10}  {'calls':>7}  {'total s':>10}  {'%':>6}"]
            lines.append(
                f"{'Total':<{width}}  {'-':>10}  {sum(calls.values()):>7}  {elapsed:>10.5f}  {100:>6.1f}"
            )
        else:
            lines = [f"{'action':<{width}}  {'mean s':>10}  {'total s':>10}"]
        for name, s in sorted(seconds.items(), key=lambda kv: -kv[1]):
            n = calls[name]
            row = f"{name:<{width}}  {s / n:>10.5f}  "
            row += f"{n:>7}  {s:>10.5f}  {100 * s / elapsed:>6.1f}" if self.extended else f"{s:>10.5f}"
            lines.append(row)
        return "\n".join([title, *lines])


class PassThroughProfiler(Profiler):
    """Lightning's profiler that records nothing: ``Trainer(profiler=PassThroughProfiler())`` is ``profiler=None``
    (the loop then times no section at all)."""

    def start(self, action_name: str) -> None:
        """Records nothing."""

    def stop(self, action_name: str) -> None:
        """Records nothing."""
