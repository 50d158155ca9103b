"""DummyLogger: a logger that accepts every call and keeps nothing (Lightning's name; what fast_dev_run-style code
can be handed instead of a real logger so that ``self.logger.experiment.add_image(...)`` still runs)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from tandem_core.rank_zero import rank_zero_only
from trainer.loggers.base import Logger


def _ignore(*args: Any, **kwargs: Any) -> None:
    return None


class DummyExperiment:
    """Every method exists and does nothing; indexing gives the experiment back."""

    def __getattr__(self, name: str) -> Any:
        return _ignore

    def __getitem__(self, idx: int) -> DummyExperiment:
        return self

    def __setitem__(self, idx: int, value: Any) -> None:
        pass


def rank_zero_experiment(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """Lightning's decorator for a logger's `experiment` getter: on ranks other than 0 it gives a DummyExperiment,
    so that code run on every rank (``self.logger.experiment.add_image(...)``) creates and writes nothing there."""

    @functools.wraps(fn)
    def experiment(self: Any) -> Any:
        if rank_zero_only.rank > 0:
            return DummyExperiment()
        return fn(self)

    return experiment


class DummyLogger(Logger):
    """``DummyLogger()``: no directory, no version, no files; any method call is accepted and ignored."""

    def __init__(self) -> None:
        self._experiment = DummyExperiment()

    @property
    def experiment(self) -> DummyExperiment:
        """An object whose every method does nothing (Lightning's DummyExperiment)."""
        return self._experiment

    def log_metrics(self, *args: Any, **kwargs: Any) -> None:
        pass

    def log_hyperparams(self, *args: Any, **kwargs: Any) -> None:
        pass

    @property
    def name(self) -> str:  # type: ignore[override]
        """An empty name."""
        return ""

    @property
    def version(self) -> str:
        return ""

    @property
    def save_dir(self) -> None:  # type: ignore[override]
        """None: a DummyLogger writes nothing."""
        return None

    @property
    def log_dir(self) -> None:  # type: ignore[override]
        return None

    @property
    def root_dir(self) -> str:
        """Empty: no experiment directory (fast_dev_run's stand-in logger writes nothing)."""
        return ""

    def __getitem__(self, idx: int) -> DummyLogger:
        return self

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _ignore
