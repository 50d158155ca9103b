"""Profiler: the base of every profiler (Lightning's ``lightning.pytorch.profilers.Profiler``), and where a
profiler's report goes.

A subclass answers `start(action)` and `stop(action)` (and `summary()`); the loop times each named section
through `section` (which is `profile`: start, the block, stop), hooks through `wrap` and batch fetches
through `fetches`. When a stage starts the Trainer calls ``setup(stage, local_rank, log_dir)`` (local_rank only
in a run of several processes), when it ends `describe()`: the report is written to
``<dirpath>/<stage>-<filename>[-<local_rank>].txt`` when a `filename` is given (`dirpath` defaults to the
run's log_dir), else printed by global rank 0. Example::

    class Wall(Profiler):
        def start(self, action): ...
        def stop(self, action): ...
    Trainer(profiler=Wall(filename="wall"))
"""

from __future__ import annotations

import contextlib
import os
import re
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from tandem_core.fileio import refuse_url
from tandem_core.rank_zero import rank_zero_only

_END = object()


class Profiler(ABC):
    """Lightning's profiler base: `dirpath` and `filename` say where the report goes (see the module)."""

    def __init__(self, dirpath: str | Path | None = None, filename: str | None = None) -> None:
        refuse_url(str(dirpath) if dirpath is not None else None, "profiler dirpath")
        self.dirpath = dirpath
        self.filename = filename
        self._stage: str | None = None
        self._local_rank: int | None = None
        self._output: TextIO | None = None

    @abstractmethod
    def start(self, action_name: str) -> None:
        """Begin timing `action_name`."""

    @abstractmethod
    def stop(self, action_name: str) -> None:
        """End timing `action_name`."""

    def summary(self) -> str:
        """The report of what was recorded (empty here)."""
        return ""

    @contextlib.contextmanager
    def profile(self, action_name: str) -> Iterator[str]:
        """``with profiler.profile("my action"): ...``: start, the block, stop."""
        self.start(action_name)
        try:
            yield action_name
        finally:
            self.stop(action_name)

    def section(self, name: str) -> contextlib.AbstractContextManager[Any]:
        """The loop's timed section `name` (`profile`)."""
        return self.profile(name)

    def wrap(self, name: str, fn: Any) -> Any:
        """`fn` timed under `name` (the hook dispatcher wraps every hook it calls)."""

        def timed(*args: Any, **kwargs: Any) -> Any:
            with self.section(name):
                return fn(*args, **kwargs)

        return timed

    def fetches(self, name: str, iterable: Any) -> Iterator[Any]:
        """`iterable`'s items, each fetch (and the one that finds the end) timed under `name`."""
        it = iter(iterable)
        while True:
            with self.section(name):
                try:
                    item = next(it)
                except StopIteration:
                    item = _END
            if item is _END:
                return
            yield item

    # ----- a stage's life: the Trainer calls these ---------------------------------------------------
    def setup(self, stage: str, local_rank: int | None = None, log_dir: str | None = None) -> None:
        """A stage starts: the report will be named after `stage` (and `local_rank`, in a run of several
        processes); an unset dirpath becomes `log_dir`."""
        self._stage, self._local_rank = stage, local_rank
        self.dirpath = self.dirpath or log_dir

    def attach(self, trainer: Any) -> None:
        """A stage starts under `trainer` (after setup): profilers that trace the whole stage begin here."""
        return

    def describe(self) -> None:
        """Write the report: to this rank's file when a filename is set, else printed by rank 0."""
        summary = self.summary()
        if summary:
            if self.filename and self.dirpath:
                self._write(summary)
            elif rank_zero_only.rank == 0:
                print(f"[tandem] profiler ({type(self).__name__}):\n{summary}")
        self.teardown(self._stage)

    def _write(self, text: str) -> None:
        os.makedirs(self.dirpath, exist_ok=True)  # type: ignore[arg-type]
        if self._output is None:
            path = os.path.join(self.dirpath, self._prepare_filename())  # type: ignore[arg-type]
            self._output = open(path, "a")  # noqa: SIM115 (closed by teardown)
        self._output.write(text)
        self._output.flush()

    def teardown(self, stage: str | None = None) -> None:
        """A stage ended: the report file is closed."""
        if self._output is not None:
            self._output.close()
            self._output = None

    def _prepare_filename(self, action_name: str | None = None, extension: str = ".txt") -> str:
        """``<stage>-<filename>-<local_rank>-<action>`` of what is known, made safe as a file name."""
        parts = [p for p in (self._stage, self.filename) if p]
        if self._local_rank is not None:
            parts.append(str(self._local_rank))
        if action_name is not None:
            parts.append(action_name)
        base = re.sub(r"_+", "_", re.sub(r"[\\/:*?\"<>|\n\r\t]", "_", "-".join(parts))).strip()
        return (base or "profile") + extension

    @property
    def local_rank(self) -> int:
        """This process's local rank in the stage (0 in a run of one process)."""
        return 0 if self._local_rank is None else self._local_rank

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_output"] = None  # an open file does not pickle (ddp_spawn, deepcopy)
        return state

    def __del__(self) -> None:
        if getattr(self, "_output", None) is not None:  # (not after a constructor that raised)
            self.teardown(self._stage)
