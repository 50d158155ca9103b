"""The Trainer's ``profiler`` option: the profilers live in trainer/profilers/ (Lightning's
``lightning.pytorch.profilers``); this module keeps the names the loop imports."""

from __future__ import annotations

from trainer.profilers import (
    PROFILERS,
    REFUSED,
    AdvancedProfiler,
    PassThroughProfiler,
    Profiler,
    PyTorchProfiler,
    SimpleProfiler,
    action_key,
    make_profiler,
)

__all__ = [
    "PROFILERS",
    "REFUSED",
    "AdvancedProfiler",
    "PassThroughProfiler",
    "Profiler",
    "PyTorchProfiler",
    "SimpleProfiler",
    "action_key",
    "make_profiler",
]
