"""Checkpoints: what a run saves and restores (run.py), which file is meant (find.py), the file and
directory forms (io.py), what a file may hold (format.py) and reading sharded directories safely (dcp_read.py)."""

from strategies.checkpoint.checks import check_compatible
from strategies.checkpoint.io import atomic_save, load
from trainer.checkpoint.find import choose, find_last, run_id, stop_path
from trainer.checkpoint.run import (
    Restoring,
    check_window_saves,
    expect_restore,
    finish,
    prepare_restore,
    rebuild_task,
    restore,
    save,
)

__all__ = [
    "Restoring", "atomic_save", "check_compatible", "check_window_saves", "expect_restore", "find_last", "finish",
    "load", "prepare_restore",
    "rebuild_task",
    "choose", "restore", "run_id", "save", "stop_path",
]  # fmt: skip
