"""Profilers (Lightning's ``lightning.pytorch.profilers``): ``Trainer(profiler="simple" | "advanced" | "pytorch")``
or an instance of these classes, or of your own subclass of `Profiler` (base.py: where the report goes, ``dirpath``
and ``filename``). The loop keys each action as Lightning does (`action_key`)."""

from __future__ import annotations

from typing import Any

import torch

from callbacks.base import Callback
from trainer.profilers.advanced import AdvancedProfiler
from trainer.profilers.base import Profiler
from trainer.profilers.pytorch import PyTorchProfiler, RegisterRecordFunction
from trainer.profilers.simple import PassThroughProfiler, SimpleProfiler

__all__ = [
    "PROFILERS",
    "REFUSED",
    "AdvancedProfiler",
    "PassThroughProfiler",
    "Profiler",
    "PyTorchProfiler",
    "RegisterRecordFunction",
    "SimpleProfiler",
    "action_key",
    "make_profiler",
]


def action_key(owner: Any, name: str) -> str:
    """The profiler's key of `owner`'s hook or method `name`, as Lightning's: ``[Callback]<state_key>.<name>``,
    ``[LightningModule]<class>.<name>`` (the task) or ``[LightningDataModule]<class>.<name>``."""
    if isinstance(owner, Callback):
        return f"[Callback]{owner.state_key}.{name}"
    kind = (
        "LightningModule" if isinstance(owner, torch.nn.Module) else "LightningDataModule"
    )  # a task is a Module
    return f"[{kind}]{type(owner).__name__}.{name}"


PROFILERS = {"simple": SimpleProfiler, "advanced": AdvancedProfiler, "pytorch": PyTorchProfiler}
REFUSED = {"xla": "profiler='xla' profiles TPUs, which Tandem does not support; use 'pytorch' or 'simple'"}


def make_profiler(kind: str | Profiler | None) -> Profiler | None:
    """The profiler a Trainer option names, case-insensitively (None: no profiling, also for a
    PassThroughProfiler)."""
    if isinstance(kind, PassThroughProfiler):
        return None
    if kind is None or isinstance(kind, Profiler):
        return kind
    return PROFILERS[kind.lower()]()
