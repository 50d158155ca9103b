"""AdvancedProfiler: Python's cProfile per named action (Lightning's ``profiler="advanced"``): which functions each
hook, step and batch fetch spent its time in, sorted by cumulative time."""

from __future__ import annotations

import cProfile
import io
import os
import pstats
from pathlib import Path
from typing import Any

from tandem_core.errors import ConfigError
from trainer.profilers.base import Profiler


class AdvancedProfiler(Profiler):
    """One cProfile per action; the report lists each action's functions, the `line_count_restriction` first
    (a count, or a fraction of them), and `dump_stats` writes each action's raw stats to
    ``<dirpath>/<stage>-<filename>-<action>.prof`` (for snakeviz or pstats). Sections nest as cProfile allows:
    starting an action pauses the others. Example: ``Trainer(profiler=AdvancedProfiler(filename="perf"))``."""

    def __init__(
        self,
        dirpath: str | Path | None = None,
        filename: str | None = None,
        line_count_restriction: float = 1.0,
        dump_stats: bool = False,
    ) -> None:
        super().__init__(dirpath, filename)
        self.profiled_actions: dict[str, cProfile.Profile] = {}
        self.line_count_restriction = line_count_restriction
        self.dump_stats = dump_stats

    def start(self, action_name: str) -> None:
        """Profile `action_name` (pausing the action profiled until now)."""
        for profile in self.profiled_actions.values():
            profile.disable()
        profile = self.profiled_actions.get(action_name)
        if profile is None:
            profile = self.profiled_actions[action_name] = cProfile.Profile()
        profile.enable()

    def stop(self, action_name: str) -> None:
        """Stop profiling `action_name` (a ValueError if it was never started)."""
        profile = self.profiled_actions.get(action_name)
        if profile is None:
            raise ValueError(
                f"Attempting to stop recording an action ({action_name}) which was never started"
            )
        profile.disable()

    def summary(self) -> str:
        """Each action's functions by cumulative time (and, with dump_stats, each action's .prof file)."""
        title = f"{self._stage.upper()} Profiler Report" if self._stage else "Profiler Report"
        parts = [title]
        for action, profile in self.profiled_actions.items():
            if self.dump_stats:
                self._dump(action, profile)
            out = io.StringIO()
            pstats.Stats(profile, stream=out).strip_dirs().sort_stats("cumulative").print_stats(
                self.line_count_restriction
            )
            rank = f" (local rank {self._local_rank})" if self._local_rank is not None else ""
            parts += [f"Profile stats for: {action}{rank}", out.getvalue()]
        return os.linesep.join(parts)

    def _dump(self, action: str, profile: cProfile.Profile) -> None:
        if not self.dirpath:
            raise ConfigError(
                "AdvancedProfiler(dump_stats=True) needs a dirpath (or a Trainer's log_dir) to write to"
            )
        os.makedirs(self.dirpath, exist_ok=True)
        profile.dump_stats(os.path.join(self.dirpath, self._prepare_filename(action, ".prof")))

    def teardown(self, stage: str | None = None) -> None:
        super().teardown(stage)
        self.profiled_actions.clear()

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["profiled_actions"] = {}  # cProfile's profiles do not pickle (ddp_spawn, deepcopy)
        return state
