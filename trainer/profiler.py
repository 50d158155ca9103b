"""profiler="simple" | "advanced" | "pytorch": where a run spends its time (Lightning's Trainer option).

"pytorch" (Lightning's PyTorchProfiler) writes torch.profiler traces that TensorBoard's profiler plugin shows:
``<log_dir>/<stage>/rank<N>.<time>.pt.trace.json`` (view with ``tensorboard --logdir <log_dir>``)."""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import torch

from callbacks.base import Callback


def action_key(owner: Any, name: str) -> str:
    """The profiler's key of `owner`'s hook or method `name`, as Lightning's: ``[Callback]<state_key>.<name>``,
    ``[LightningModule]<class>.<name>`` (the task) or ``[LightningDataModule]<class>.<name>``."""
    if isinstance(owner, Callback):
        return f"[Callback]{owner.state_key}.{name}"
    kind = (
        "LightningModule" if isinstance(owner, torch.nn.Module) else "LightningDataModule"
    )  # a task is a Module
    return f"[{kind}]{type(owner).__name__}.{name}"


class SimpleProfiler:
    """Wall time per named action, under Lightning's keys: each hook as ``[Callback]<state_key>.<hook>``,
    ``[LightningModule]<class>.<hook>`` or ``[LightningDataModule]<class>.<hook>``, each batch fetch as
    ``[_TrainingEpochLoop].train_dataloader_next`` / ``[_EvaluationLoop].val_next`` (``test_next``) /
    ``[_PredictionLoop].predict_next``, and the loop's ``training_step``, ``backward``, ``optimizer_step``.
    `recorded_durations` holds every duration (seconds) per action, as Lightning's."""

    def __init__(self) -> None:
        self.recorded_durations: dict[str, list[float]] = defaultdict(list)

    @property
    def seconds(self) -> dict[str, float]:
        """Total seconds per action."""
        return {name: sum(d) for name, d in self.recorded_durations.items()}

    @property
    def calls(self) -> dict[str, int]:
        """How many times each action ran."""
        return {name: len(d) for name, d in self.recorded_durations.items()}

    @contextlib.contextmanager
    def section(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.recorded_durations[name].append(time.perf_counter() - start)

    def profile(self, name: str) -> contextlib.AbstractContextManager[None]:
        """Lightning's name for `section`: ``with trainer.profiler.profile("my_action"): ...``."""
        return self.section(name)

    def wrap(self, name: str, fn: Any) -> Any:
        """`fn` timed under `name` (the hook dispatcher wraps every hook it calls)."""

        def timed(*args: Any, **kwargs: Any) -> Any:
            with self.section(name):
                return fn(*args, **kwargs)

        return timed

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

    def start(self, trainer: Any = None) -> None:
        """Called when a stage starts (with the Trainer)."""

    def summary(self) -> str:
        seconds, calls = self.seconds, self.calls
        total = sum(seconds.values()) or 1.0
        rows = sorted(seconds.items(), key=lambda kv: -kv[1])
        width = max([len(k) for k in seconds] + [6])
        lines = [f"{'action':<{width}}  {'calls':>7}  {'total s':>9}  {'mean ms':>9}  {'%':>5}"]
        for name, s in rows:
            n = calls[name]
            lines.append(f"{name:<{width}}  {n:>7}  {s:>9.3f}  {1e3 * s / n:>9.3f}  {100 * s / total:>5.1f}")
        return "\n".join(lines)


class AdvancedProfiler(SimpleProfiler):
    """torch.profiler over the whole stage, plus the simple sections as record_function ranges."""

    def __init__(self) -> None:
        super().__init__()
        self._torch: Any = None

    def start(self, trainer: Any = None) -> None:
        import torch.profiler

        self._torch = torch.profiler.profile(record_shapes=False, **self._profile_kwargs(trainer))
        self._torch.__enter__()

    def _profile_kwargs(self, trainer: Any) -> dict[str, Any]:
        return {}

    @contextlib.contextmanager
    def section(self, name: str) -> Iterator[None]:
        import torch.profiler

        with torch.profiler.record_function(name), super().section(name):
            yield

    def summary(self) -> str:
        if self._torch is None:
            return super().summary()
        self._torch.__exit__(None, None, None)
        table = self._torch.key_averages().table(sort_by="cpu_time_total", row_limit=25)
        self._torch = None
        return table


class PyTorchProfiler(AdvancedProfiler):
    """torch.profiler over each stage, its trace written for TensorBoard's profiler plugin (torch's
    tensorboard_trace_handler) into `dirpath` (default: the run's log_dir), one file per rank and stage."""

    def __init__(self, dirpath: str | None = None) -> None:
        super().__init__()
        self.dirpath = dirpath
        self.trace_dirs: list[str] = []  # where each stage's trace went

    def _profile_kwargs(self, trainer: Any) -> dict[str, Any]:
        import os

        from torch.profiler import tensorboard_trace_handler

        stage = (
            getattr(getattr(trainer, "state", None), "entry", None) or "stage"
        )  # fit, validate, test, predict

        def write(prof: Any) -> None:  # at the stage's end, when every rank knows the run's log_dir
            root = self.dirpath or (trainer.log_dir if trainer is not None else os.getcwd())
            rank = trainer.global_rank if trainer is not None else 0
            folder = os.path.join(root, stage)
            self.trace_dirs.append(folder)
            tensorboard_trace_handler(folder, worker_name=f"rank{rank}")(prof)

        return {"on_trace_ready": write}


class PassThroughProfiler:
    """Lightning's profiler that records nothing: ``Trainer(profiler=PassThroughProfiler())`` is ``profiler=None``
    (the loop then times no section at all)."""

    def summary(self) -> str:
        """Nothing was recorded."""
        return ""


PROFILERS = {"simple": SimpleProfiler, "advanced": AdvancedProfiler, "pytorch": PyTorchProfiler}
REFUSED = {"xla": "profiler='xla' profiles TPUs, which Tandem does not support; use 'pytorch' or 'simple'"}


def make_profiler(kind: str | SimpleProfiler | PassThroughProfiler | None) -> SimpleProfiler | None:
    """The profiler a Trainer option names (None: no profiling, also for a PassThroughProfiler)."""
    if isinstance(kind, PassThroughProfiler):
        return None
    if kind is None or isinstance(kind, SimpleProfiler):
        return kind
    return PROFILERS[kind]()
