"""Batch-size scaling (Lightning's scale_batch_size): try larger batch sizes, a few steps each, until one
runs out of memory; 'power' doubles, 'binsearch' then bisects. Everything is put back afterwards except the
batch size found (trainer/tuner/snapshot.py)."""

from __future__ import annotations

import gc
import logging
import warnings
from typing import TYPE_CHECKING

import torch

from callbacks.finders import attrs
from trainer.tuner.run import run_eval_trial, run_fit_trial
from trainer.tuner.snapshot import Snapshot

if TYPE_CHECKING:
    from trainer.trainer import Trainer

log = logging.getLogger(__name__)
_PHASE = {"fit": "train", "validate": "val", "test": "test", "predict": "predict"}


def is_oom_error(e: BaseException) -> bool:
    """torch's OutOfMemoryError, or the messages of CUDA, cuDNN and the CPU allocator running out."""
    if isinstance(e, torch.OutOfMemoryError):
        return True
    text = str(e.args[0]) if isinstance(e, RuntimeError) and len(e.args) == 1 else ""
    return (
        ("CUDA" in text and "out of memory" in text)
        or "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED." in text
        or "DefaultCPUAllocator: can't allocate memory" in text
    )


def _free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _dataset_length(t: Trainer) -> int | None:
    loaders = t.loaders.get(_PHASE[t.state.entry or "fit"], [])
    try:
        return sum(len(dl.dataset) for dl in loaders) if loaders else None
    except (TypeError, AttributeError):
        return None


def _adjust(
    t: Trainer, name: str, factor: float = 1.0, value: int | None = None, max_val: int = 8192, desc: str = ""
) -> tuple[int, bool]:
    """Set the task's batch size (to `value`, or times `factor`, at most max_val); False when unchanged or
    when it already covers the whole data set. `desc` ("succeeded"/"failed": how the last trial went) logs
    the step, as Lightning logs it."""
    task = t.task
    size = attrs.get(task, name)
    length = _dataset_length(t)
    if length is not None and size >= length:
        log.info(f"The batch size {size} is greater or equal than the length of the data set ({length}).")
        return size, False
    new = min(value if value is not None else int(size * factor), max_val)
    if desc:
        log.info(f"Batch size {size} {desc}; trying batch size {new}")
    attrs.set_everywhere(task, name, new)
    return new, new != size


def scale_batch_size(
    t: Trainer, mode: str = "power", steps_per_trial: int = 3, init_val: int = 2, max_trials: int = 25,
    batch_arg_name: str = "batch_size", margin: float = 0.05, max_val: int = 8192,
) -> int | None:  # fmt: skip
    """The largest batch size that runs `steps_per_trial` steps of the current stage without running out of
    memory (with binsearch, less `margin`); set on the task (or datamodule) and its loaders rebuilt with it."""
    if t.config.fast_dev_run:
        warnings.warn("scale_batch_size is skipped under fast_dev_run.", UserWarning, stacklevel=2)
        return None
    stage = t.state.entry or "fit"
    session = t.session
    assert session is not None
    snap = Snapshot(t)
    snap.isolate([])

    def trial() -> None:
        snap.reset_loop()
        t.state.global_step, t.state.epoch = (
            0,
            0,
        )  # each trial from the start, as Lightning's (progress reset)
        session.reload()  # the loaders at the batch size being tried
        if stage == "fit":
            run_fit_trial(
                t,
                {
                    "max_steps": steps_per_trial,
                    "limit_train_batches": 1.0,
                    "limit_val_batches": steps_per_trial,
                },
            )
        else:
            run_eval_trial(t, _PHASE[stage], steps_per_trial)

    try:
        size, _ = _adjust(t, batch_arg_name, value=init_val, max_val=max_val)
        if mode == "power":
            size = _power(t, trial, size, batch_arg_name, max_trials, max_val)
        else:
            size = _binsearch(t, trial, size, batch_arg_name, max_trials, margin, max_val)
        _free_memory()
        log.info(f"Finished batch size finder, will continue with full run using batch size {size}")
    finally:
        snap.restore()
        session.reload()  # the run goes on with loaders of the size found
    return size


def _power(t: Trainer, trial: object, size: int, name: str, max_trials: int, max_val: int) -> int:
    """Double until a trial runs out of memory, then halve once."""
    any_success = False
    for i in range(max_trials):
        _free_memory()
        if size >= max_val:
            log.info(f"Reached the maximum batch size limit of {max_val}. Stopping search.")
            break
        try:
            trial()  # type: ignore[operator]
            if i + 1 >= max_trials:
                break
            size, changed = _adjust(t, name, factor=2.0, max_val=max_val, desc="succeeded")
            if not changed:
                break
            any_success = True
        except RuntimeError as e:
            if not is_oom_error(e):
                raise
            _free_memory()
            size, _ = _adjust(t, name, factor=0.5, max_val=max_val, desc="failed")
            if any_success:
                break
    return size


def _binsearch(
    t: Trainer, trial: object, size: int, name: str, max_trials: int, margin: float, max_val: int
) -> int:
    """Double until a trial runs out of memory, then bisect between the last size that ran and that one."""
    low, high, count = 1, None, 0
    last_ok = size
    while True:
        _free_memory()
        if size >= max_val:
            log.info(f"Reached the maximum batch size limit of {max_val}. Stopping search.")
            break
        try:
            trial()  # type: ignore[operator]
            last_ok = size
            count += 1
            if count >= max_trials:
                size = last_ok
                break
            low = size
            if high:
                if high - low <= 1:
                    break
                size, changed = _adjust(t, name, value=(high + low) // 2, max_val=max_val, desc="succeeded")
            else:
                size, changed = _adjust(t, name, factor=2.0, max_val=max_val, desc="succeeded")
            if not changed:
                break
        except RuntimeError as e:
            if not is_oom_error(e):
                raise
            _free_memory()
            high = size
            size, _ = _adjust(t, name, value=(high + low) // 2, max_val=max_val, desc="failed")
            if high - low <= 1:
                break
    if margin > 0:
        reduced = max(1, int(size * (1 - margin)))
        if reduced != size:
            log.info(f"Applying margin of {margin:.1%}, reducing batch size from {size} to {reduced}")
            size = reduced
            attrs.set_everywhere(t.task, name, size)
    return size
