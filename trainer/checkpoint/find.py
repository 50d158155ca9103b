"""Finding checkpoints: which file `resume="auto"`, `ckpt_path="last"`/`"best"` and a stop signal mean.

resume="auto" and ckpt_path="last" look only in this run's own checkpoint directory: each checkpoint
callback's dirpath and, for a default dirpath, its experiment's other starts
(<save_dir>/<logger name>/version_*/checkpoints, see ModelCheckpoint.last_checkpoint_path); without a
checkpoint callback, <default_root_dir>/checkpoints (where a stop signal saves). Nothing is searched
recursively and no directory symlink is followed. The file's run id (experiment name, task class) must
match this run's.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import torch

from trainer.checkpoint.io import META
from trainer.errors import CheckpointError

if TYPE_CHECKING:
    from trainer.trainer import Trainer


def run_id(t: Trainer) -> dict[str, str]:
    """Who wrote a checkpoint: the experiment (the first logger's name, "" without one) and the task class."""
    task = t.task
    return {
        "experiment": t.loggers[0].name if t.loggers else "",
        "task_class": "" if task is None else f"{type(task).__module__}.{type(task).__qualname__}",
    }


def find_last(t: Trainer) -> str | None:
    """For resume='auto': this run's own newest last checkpoint, or None for a fresh start (said, when a
    file was there but belongs to another experiment or task)."""
    path = _own_last(t)
    if path is None:
        return None
    problem = _other_run(t, path)
    if problem is not None:
        t.print(f"resume='auto': not resuming {path} ({problem}); starting fresh.")
        return None
    return path


def _own_last(t: Trainer) -> str | None:
    from callbacks.checkpoint_names import newest_last

    last = _callback_last(t)
    if last is not None or t.checkpoint_callbacks:
        return last
    return newest_last([os.path.dirname(stop_path(t))])


def _callback_last(t: Trainer) -> str | None:
    for cb in t.checkpoint_callbacks:
        last = getattr(cb, "last_checkpoint_path", lambda: None)()
        if last and os.path.exists(last):
            return last
    return None


def _other_run(t: Trainer, path: str) -> str | None:
    """Why `path` is not this run's (its stored run id differs), or None. Files without a run id pass."""
    head = os.path.join(path, META) if os.path.isdir(path) else path  # a sharded directory's metadata
    try:  # memory-mapped: only the small header entries are read here, restore reads the tensors
        ckpt = torch.load(head, map_location="cpu", weights_only=True, mmap=True)
    except OSError:
        if os.path.lexists(path):  # a directory without its metadata: restore says what is wrong
            return None
        return "it was removed while resuming"
    except Exception:
        return None  # restore reports what is wrong with the file
    saved = ckpt.get("run_id") if isinstance(ckpt, dict) else None
    if not isinstance(saved, dict):
        return None
    own = run_id(t)
    differ = [f"{k} {saved.get(k)!r}, this run's {v!r}" for k, v in own.items() if saved.get(k) != v]
    return "saved by another run: " + "; ".join(differ) if differ else None


def resolve_path(t: Trainer, path: str) -> str:
    """ "best" and "last" (Lightning's shorthands) through the checkpoint callback, else the path itself."""
    if path == "best":
        for cb in t.checkpoint_callbacks:
            best = getattr(cb, "best_model_path", "")
            if best and os.path.exists(best):
                return best
        raise CheckpointError(
            "ckpt_path='best' found no best checkpoint; enable ModelCheckpoint(monitor=...) "
            "in this Trainer's fit, or pass a file path."
        )
    if path != "last":
        return path
    last = _own_last(t)
    if last is None:
        raise CheckpointError(
            "ckpt_path='last' found no last checkpoint of this run; enable ModelCheckpoint(save_last=True) "
            "in the run you resume (same default_root_dir and logger name), or pass a file path."
        )
    problem = _other_run(t, last)
    if problem is not None:
        raise CheckpointError(
            f"ckpt_path='last' found {last!r}, {problem}; pass that file's path to resume it anyway, "
            "or leave ckpt_path unset to start fresh."
        )
    return last


def stop_path(t: Trainer) -> str:
    """Where a SIGINT/SIGTERM stop writes: the checkpoint callback's last.ckpt, or <root>/checkpoints."""
    for cb in t.checkpoint_callbacks:
        dirpath = getattr(cb, "dirpath", None)
        if dirpath:
            return os.path.join(dirpath, "last.ckpt")
    return os.path.join(t.default_root_dir, "checkpoints", "last.ckpt")
