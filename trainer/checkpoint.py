"""Checkpoints: what a Trainer saves and restores, atomic writes, and checked reads."""

from __future__ import annotations

import glob
import os
import warnings
from typing import TYPE_CHECKING, Any

import torch

from trainer.ckpt_format import decode, encode, missing, read
from trainer.errors import CheckpointError
from trainer.fileio import atomic_write
from trainer.optim import step_schedulers

if TYPE_CHECKING:
    from trainer.trainer import Trainer

FORMAT_VERSION = 2


def atomic_save(obj: Any, path: str | os.PathLike[str]) -> None:
    """torch.save `obj` to `path` atomically (see trainer.fileio.atomic_write)."""
    atomic_write(path, lambda f: torch.save(obj, f))


def save(t: Trainer, path: str, weights_only: bool = False) -> None:
    """Write the run's state to `path`: rank 0 writes, every rank contributes its own part and waits."""
    task, comm = t.task, t.strategy.comm
    if task is None:
        raise CheckpointError("save_checkpoint needs a task: call it during or after fit().")
    ckpt: dict[str, Any] = {
        "tandem_version": FORMAT_VERSION,
        "task_class": f"{type(task).__module__}.{type(task).__qualname__}",
        "state_dict": task.state_dict(),
        "hyper_parameters": encode(dict(task.hparams), "hyper_parameters"),
        "config": t.resolved_config,  # the run config that built this trainer (trainer/config.py)
    }
    if weights_only:
        ckpt.update(t.state.state_dict())
    else:
        mid_window = t.state.mid_window(t.config.accumulate_grad_batches, task.automatic_optimization)
        grads = (
            [None if p.grad is None else p.grad.detach().cpu().clone() for p in task.parameters()]
            if mid_window
            else None
        )
        ckpt.update(t.state.state_dict(ranks=comm.gather_object(t.state.rank_state(grads))))
        # what a ReduceLROnPlateau needs when resuming from inside an epoch's end
        ckpt["loop"]["callback_metrics"] = {k: v.detach().cpu() for k, v in t.callback_metrics.items()}
        ckpt.update(
            optimizer_states=[o.state_dict() for o in t.optimizers],
            lr_schedulers=[c.scheduler.state_dict() for c in t.lr_scheduler_configs],
            strategy=t.strategy.state_dict(),
            callbacks={cb.state_key: cb.state_dict() for cb in t.callbacks},
        )
        if t.datamodule is not None:
            ckpt["datamodule"] = t.datamodule.state_dict()
            ckpt["datamodule_hyper_parameters"] = encode(dict(t.datamodule.hparams), "datamodule hparams")
        t.hooks.call("on_save_checkpoint", ckpt)
    if comm.is_global_zero:
        atomic_save(ckpt, path)
    comm.barrier("save_checkpoint")


def restore(t: Trainer, path: str, stage: str) -> None:
    """Load `path` ("best", "last" or a file) into the task and, for fit, into the whole run."""
    path = resolve_path(t, path)
    check_same_file_everywhere(t, path)
    task = t.task
    assert task is not None
    ckpt = load(path)
    check_compatible(task, ckpt["state_dict"], path)
    task.load_state_dict(ckpt["state_dict"])
    if stage == "fit" and "ranks" in ckpt.get("loop", {}):
        if len(ckpt["optimizer_states"]) != len(t.optimizers):
            raise CheckpointError(
                f"checkpoint {path!r} has {len(ckpt['optimizer_states'])} optimizer(s) but "
                f"configure_optimizers returned {len(t.optimizers)}."
            )
        for opt, state in zip(t.optimizers, ckpt["optimizer_states"]):
            opt.load_state_dict(state)
        for cfg, state in zip(t.lr_scheduler_configs, ckpt["lr_schedulers"]):
            cfg.scheduler.load_state_dict(state)
        t.strategy.load_state_dict(ckpt.get("strategy", {}))
        _restore_loop(t, ckpt)
        for cb in t.callbacks:
            if cb.state_key in ckpt.get("callbacks", {}):
                cb.load_state_dict(ckpt["callbacks"][cb.state_key])
        if t.datamodule is not None and "datamodule" in ckpt:
            t.datamodule.load_state_dict(ckpt["datamodule"])
    t.hooks.call("on_load_checkpoint", ckpt)


def check_same_file_everywhere(t: Trainer, path: str) -> None:
    """Every rank must read the file rank 0 resumes from (several nodes: a shared filesystem is assumed)."""
    comm = t.strategy.comm
    if comm.world_size == 1:
        return
    sizes = comm.gather_object(os.path.getsize(path) if os.path.isfile(path) else -1)
    differ = [r for r, size in enumerate(sizes) if size != sizes[0]]
    if differ:
        raise CheckpointError(
            f"checkpoint {path!r} is {'missing' if min(sizes) < 0 else 'different'} on rank(s) {differ} "
            f"(sizes by rank: {sizes}): resuming on several nodes assumes a filesystem shared by every "
            "node. Put the checkpoint directory (default_root_dir or ModelCheckpoint(dirpath=...)) on shared "
            "storage, or copy the file to the same path on every node."
        )


def _restore_loop(t: Trainer, ckpt: dict[str, Any]) -> None:
    task, state = t.task, t.state
    assert task is not None
    state.load_state_dict(ckpt, t.global_rank)
    if state.window_grads is not None:  # inside an accumulation window the gradients so far are state too
        for p, g in zip(task.parameters(), state.window_grads):
            p.grad = None if g is None else g.to(p.device)
        state.window_grads = None
    if state.epoch_finished:  # saved during the epoch's end, before its schedulers stepped: finish it
        if task.automatic_optimization:
            t.metric_store.callback_metrics.update(ckpt["loop"].get("callback_metrics", {}))
            # the fresh optimizer has not stepped yet, so torch's order warning does not apply
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step")
                step_schedulers(t, "epoch")
        state.next_epoch()


def rebuild_task(
    cls: type,
    path: str,
    map_location: Any,
    strict: bool,
    overrides: dict[str, Any],
    weights_only: bool = True,
) -> Any:
    """Task.load_from_checkpoint: cls(**saved hyperparameters, **overrides) with the saved weights."""
    ckpt = load(path, map_location if map_location is not None else "cpu", weights_only)
    hparams = ckpt.get("hyper_parameters", {})
    absent = {k: v for k, v in missing(hparams).items() if k not in overrides}
    if absent:
        raise CheckpointError(
            f"checkpoint {path!r} could not store hyperparameters {absent}; pass them: "
            f"{cls.__name__}.load_from_checkpoint(path, {', '.join(f'{k}=...' for k in absent)})"
        )
    task = cls(**{**decode({k: v for k, v in hparams.items() if k not in overrides}), **overrides})
    task.configure_model()  # a task that builds layers lazily needs them before the weights load
    if strict:
        check_compatible(task, ckpt["state_dict"], path)
    task.load_state_dict(ckpt["state_dict"], strict=strict)
    task.on_load_checkpoint(ckpt)
    if isinstance(map_location, (str, torch.device)):
        task.to(map_location)
    return task


# ----- finding files ------------------------------------------------------------------------------
def find_last(t: Trainer) -> str | None:
    """For resume='auto': the checkpoint callbacks' last file, else the newest last.ckpt under
    default_root_dir (log versions change between restarts), else None for a fresh start."""
    last = _callback_last(t)
    if last is not None:
        return last
    found = glob.glob(os.path.join(t.default_root_dir, "**", "last.ckpt"), recursive=True)
    return max(found, key=os.path.getmtime) if found else None


def _callback_last(t: Trainer) -> str | None:
    for cb in t.checkpoint_callbacks:
        last = getattr(cb, "last_checkpoint_path", lambda: None)()
        if last and os.path.isfile(last):
            return last
    return None


def resolve_path(t: Trainer, path: str) -> str:
    """ "best" and "last" (Lightning's shorthands) through the checkpoint callback, else the path itself."""
    if path == "best":
        for cb in t.checkpoint_callbacks:
            best = getattr(cb, "best_model_path", "")
            if best and os.path.isfile(best):
                return best
        raise CheckpointError(
            "ckpt_path='best' found no best checkpoint; enable ModelCheckpoint(monitor=...) "
            "in this Trainer's fit, or pass a file path."
        )
    if path != "last":
        return path
    last = _callback_last(t)
    if last is not None:
        return last
    raise CheckpointError(
        "ckpt_path='last' found no last checkpoint; enable ModelCheckpoint(save_last=True) "
        "in the run you resume, or pass a file path."
    )


def stop_path(t: Trainer) -> str:
    """Where a SIGINT/SIGTERM stop writes: the checkpoint callback's last.ckpt, or <root>/checkpoints."""
    for cb in t.checkpoint_callbacks:
        dirpath = getattr(cb, "dirpath", None)
        if dirpath:
            return os.path.join(dirpath, "last.ckpt")
    return os.path.join(t.default_root_dir, "checkpoints", "last.ckpt")


# ----- reading ------------------------------------------------------------------------------------
def load(
    path: str | os.PathLike[str], map_location: Any = "cpu", weights_only: bool = True
) -> dict[str, Any]:
    """Read a checkpoint written by Trainer.save_checkpoint (plain data only unless weights_only=False)."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise CheckpointError(
            f"checkpoint {path!r} does not exist; pass an existing file or ckpt_path='last'."
        )
    try:
        ckpt = read(path, map_location, weights_only)
    except CheckpointError:
        raise
    except Exception as e:
        raise CheckpointError(f"checkpoint {path!r} could not be read ({type(e).__name__}: {e}).") from e
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt:
        raise CheckpointError(
            f"{path!r} is not a Tandem checkpoint (no 'state_dict'); save one with trainer.save_checkpoint."
        )
    return ckpt


def check_compatible(model: torch.nn.Module, state_dict: dict[str, torch.Tensor], path: str) -> None:
    """Raise CheckpointError listing what differs when the checkpoint belongs to another model."""
    own = model.state_dict()
    missing = [k for k in own if k not in state_dict]
    unexpected = [k for k in state_dict if k not in own]
    mismatched = [
        f"{k}: checkpoint {tuple(state_dict[k].shape)} vs model {tuple(v.shape)}"
        for k, v in own.items()
        if k in state_dict and isinstance(v, torch.Tensor) and tuple(state_dict[k].shape) != tuple(v.shape)
    ]
    if missing or unexpected or mismatched:
        parts = []
        if missing:
            parts.append(f"missing keys {missing[:5]}{' ...' if len(missing) > 5 else ''}")
        if unexpected:
            parts.append(f"unexpected keys {unexpected[:5]}{' ...' if len(unexpected) > 5 else ''}")
        if mismatched:
            parts.append(f"shape mismatches {mismatched[:5]}")
        raise CheckpointError(
            f"checkpoint {path!r} was saved from a different model: "
            + "; ".join(parts)
            + ". Load it into the model it was saved from, or start without ckpt_path."
        )
