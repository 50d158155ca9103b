"""Finding checkpoints: which file `resume="auto"`, `ckpt_path="last"`/`"best"` and a stop signal mean.

resume="auto" and ckpt_path="last" look only in this run's own checkpoint directory: each checkpoint
callback's dirpath and, for a default dirpath, its experiment's other starts
(<save_dir>/<logger name>/version_*/checkpoints, see ModelCheckpoint.last_checkpoint_path); without a
checkpoint callback, <default_root_dir>/checkpoints (where a stop signal saves). Nothing is searched
recursively and no directory symlink is followed. The file's run id (experiment name, task class) must
match this run's: the newest of this run's last files is taken, also when another run that shares the
directory wrote a newer one.

A stop signal never replaces a file that is not this run's (stop_path): beside another run's last.ckpt
it writes last-v1.ckpt (-v2, ...), which resume="auto" then finds.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import torch

from strategies.checkpoint.directory import META
from strategies.checkpoint.remote import fetch, is_http
from tandem_core.errors import CheckpointError, ConfigError
from tandem_core.rank_zero import rank_zero_warn

if TYPE_CHECKING:
    from trainer.trainer import Trainer


def run_id(t: Trainer) -> dict[str, str]:
    """Who wrote a checkpoint: the experiment (the first logger's name, "" without one) and the task class."""
    task = t.task
    return {
        "experiment": t.loggers[0].name if t.loggers else "",
        "task_class": "" if task is None else class_name(task),
    }


def class_name(task: Any) -> str:
    """The task's own class, also when a wrapper such as FSDP's fully_shard swapped in a subclass of it (the same
    name before and after the strategy's setup)."""
    cls = next(c for c in type(task).__mro__ if not c.__module__.startswith("torch."))
    return f"{cls.__module__}.{cls.__qualname__}"


def find_last(t: Trainer) -> str | None:
    """For resume='auto': this run's own newest last checkpoint, or None for a fresh start (said, when a
    file was there but belongs to another experiment or task)."""
    path, problem = _own_last(t)
    if path is not None and problem is not None:
        t.print(f"resume='auto': not resuming {path} ({problem}); starting fresh.")
        return None
    return path


def _own_last(t: Trainer) -> tuple[str | None, str | None]:
    """The newest last checkpoint of this run and None; else the newest one there is and why it is not
    this run's; else (None, None)."""
    candidates = _candidates(t)
    first: tuple[str | None, str | None] = (None, None)
    for path in candidates:
        problem = _other_run(t, path)
        if problem is None:
            return path, None
        if first[0] is None:
            first = (path, problem)
    return first


def _candidates(t: Trainer) -> list[str]:
    """last*.ckpt files, newest first: the first checkpoint callback's that has any, or <root>/checkpoints."""
    from callbacks.checkpoint_names import newest_lasts

    for cb in t.checkpoint_callbacks:
        paths = getattr(cb, "last_checkpoint_paths", None)
        if paths is None:  # a user's Checkpoint subclass with only last_checkpoint_path
            last = getattr(cb, "last_checkpoint_path", lambda: None)()
            found = [last] if last else []
        else:
            found = paths()
        found = [p for p in found if os.path.exists(p)]
        if found:
            return found
    if t.checkpoint_callbacks:
        return []
    return newest_lasts([os.path.join(t.default_root_dir, "checkpoints")])


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


def choose(t: Trainer, stage: str, path: str | None, task_given: bool) -> str | None:
    """What `<stage>(ckpt_path=path)` loads, read as Lightning reads it: None loads nothing when a task is given
    (or in fit), and "best" (with a warning) when validate/test/predict get none after a fit; "best" is the first
    checkpoint callback's best file (a ValueError without one); "last" is this run's newest last checkpoint, or
    nothing with a warning. (Lightning's fit also resumes from an OnExceptionCheckpoint's file when ckpt_path is
    None; Tandem resumes only when asked: ckpt_path, or resume="auto" with its ownership checks.)"""
    if path is None and (task_given or stage == "fit" or t.task is None):
        return None
    if path is None:
        from callbacks.on_exception import OnExceptionCheckpoint

        crash = any(isinstance(cb, OnExceptionCheckpoint) for cb in t.callbacks)
        tip = " There is also an on-exception checkpoint available, however it is used by default only when fitting."
        path = "best"
        rank_zero_warn(
            f"`.{stage}(ckpt_path=None)` was called without a model. The best model of the previous `fit` call will "
            f"be used.{tip if crash else ''} You can pass `.{stage}(ckpt_path='best')` to use the best model or "
            f"`.{stage}(ckpt_path='last')` to use the last model. If you pass a value, this warning will be silenced."
        )
    if path == "best":
        return _best(t, stage)
    if path == "last":
        return _last(t, stage)
    if is_http(path):  # Lightning's URL checkpoint: downloaded (every rank its own copy), then read as a file
        return fetch(path)
    return path


def _best(t: Trainer, stage: str) -> str:
    callbacks = t.checkpoint_callbacks
    if len(callbacks) > 1:
        rank_zero_warn(
            f'`.{stage}(ckpt_path="best")` is called with several checkpoint callbacks: it uses the best checkpoint '
            "path from first checkpoint callback."
        )
    if not callbacks:
        raise ConfigError(
            f'`.{stage}(ckpt_path="best")` is set but `ModelCheckpoint` is not configured: add one to the fit '
            "(enable_checkpointing=True), or pass a file path."
        )
    cb = callbacks[0]
    best = getattr(cb, "best_model_path", "")
    if not best:
        if t.config.fast_dev_run:
            raise ConfigError(
                f'`.{stage}(ckpt_path="best")` cannot run with fast_dev_run, which saves no checkpoint: pass an exact '
                f"checkpoint path to `.{stage}(ckpt_path=...)`."
            )
        raise ConfigError(
            f'`.{stage}(ckpt_path="best")` is set but `ModelCheckpoint` is not configured to save the best model '
            "(none was saved: give it a monitor, or let a fit validate), or pass a file path."
        )
    if os.path.exists(best) and not _confined(cb, best):
        raise CheckpointError(
            f"ckpt_path='best' is {best!r}, a file this run's ModelCheckpoint did not write (its state was loaded "
            "from another directory); pass that file's path to load it anyway."
        )
    return best


def _last(t: Trainer, stage: str) -> str | None:
    last, problem = _own_last(t)
    if last is None:
        rank_zero_warn(
            f'.{stage}(ckpt_path="last") is set, but there is no last checkpoint available. No checkpoint will be '
            "loaded. HINT: Set `ModelCheckpoint(..., save_last=True)`."
        )
        return None
    if problem is not None:
        raise CheckpointError(
            f"ckpt_path='last' found {last!r}, {problem}; pass that file's path to resume it anyway, "
            "or leave ckpt_path unset to start fresh."
        )
    return last


def stop_path(t: Trainer) -> str:
    """Where a SIGINT/SIGTERM stop writes: last.ckpt in the checkpoint callback's dirpath (or in
    <root>/checkpoints), unless a file there is not this run's: then last-v1.ckpt, last-v2.ckpt, ...

    Replaced are only a file this run's ModelCheckpoint wrote as its last checkpoint, or a checkpoint
    whose stored run id is this run's; a file of another run, or one without a readable run id, stays.
    Rank 0 decides, every rank gets its answer (they save together).
    """
    directory, own = os.path.join(t.default_root_dir, "checkpoints"), ""
    for cb in t.checkpoint_callbacks:
        dirpath = getattr(cb, "dirpath", None)
        if dirpath:
            directory, own = dirpath, getattr(cb, "last_model_path", "") or ""
            break
    path = os.path.join(directory, "last.ckpt")
    if t.is_global_zero:
        n = 0
        while os.path.lexists(path) and path != own and not _replaceable(t, path):
            n += 1
            path = os.path.join(directory, f"last-v{n}.ckpt")
    if t.world_size > 1:
        path = t.strategy.comm.broadcast(path, 0)
    return path


def _replaceable(t: Trainer, path: str) -> bool:
    """`path` holds a checkpoint with a stored run id, and it is this run's."""
    head = os.path.join(path, META) if os.path.isdir(path) else path
    try:
        ckpt = torch.load(head, map_location="cpu", weights_only=True, mmap=True)
    except Exception:
        return False
    return isinstance(ckpt, dict) and isinstance(ckpt.get("run_id"), dict) and _other_run(t, path) is None


def _confined(cb: Any, path: str) -> bool:
    """ckpt_path="best" loads only a file of this run's ModelCheckpoint (callbacks/checkpoint_state.py)."""
    from callbacks.checkpoint import ModelCheckpoint
    from callbacks.checkpoint_state import trusted

    return trusted(cb, path) if isinstance(cb, ModelCheckpoint) else True
