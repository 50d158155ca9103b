"""What a Trainer saves in a checkpoint and restores from one; which file is meant is trainer/checkpoint/find.py,
how the states are written and read is strategies/checkpoint/io.py (one file) and directory.py (a directory of shards)."""

from __future__ import annotations

import os
import sys
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from strategies.checkpoint.checks import FORMAT_VERSION, check_compatible, resumable
from strategies.checkpoint.directory import _existing, _read_meta
from strategies.checkpoint.io import checkpoint_io, load, saved_names
from strategies.large.init import has_meta
from strategies.large.weights import defer, expect
from tandem_core.errors import CheckpointError, ConfigError, NoTaskToSaveError
from tandem_core.fileio import wait_written
from tandem_core.hooks import overrides
from trainer.checkpoint.find import class_name, run_id
from trainer.checkpoint.format import decode_for, encode, missing, rebuilt_form, without_pickles
from trainer.loop.optim import step_schedulers
from trainer.profiler import action_key
from trainer.secrets import redact, unresolved
from trainer.task.hparams import plain_hparams

if TYPE_CHECKING:
    from trainer.trainer import Trainer


def save(t: Trainer, path: str, weights_only: bool = False) -> None:
    """Write the run's state to `path` in the strategy's form (strategies/checkpoint/io.py); every rank
    contributes its own part and returns once the checkpoint is complete."""
    task, comm, io = t.task, t.strategy.comm, checkpoint_io(t.strategy)
    if task is None:
        raise NoTaskToSaveError("save_checkpoint needs a task: call it during or after fit().")
    states = io.collect(task, None if weights_only else t.optimizers)
    if weights_only:
        ranks = None
    else:
        mid_window = t.state.mid_window(t.config.accumulate_grad_batches, task.automatic_optimization)
        ranks = comm.gather_object(t.state.rank_state(io.window_grads(task) if mid_window else None))
    io.write(contents(t, states, ranks), path, comm)


def contents(t: Trainer, states: dict[str, Any], ranks: list[dict[str, Any]] | None) -> dict[str, Any]:
    """The checkpoint dict around `states` (the weights, and the optimizer states unless `ranks` is None:
    a weights-only checkpoint); `ranks` holds each rank's own part (RNG, window gradients)."""
    task = t.task
    assert task is not None
    hparams, form = plain_hparams(task.hparams)  # a DictConfig as plain data, rebuilt on load
    ckpt: dict[str, Any] = {
        "tandem_version": FORMAT_VERSION,
        "task_class": class_name(task),
        "run_id": run_id(
            t
        ),  # resume="auto" and ckpt_path="last" resume only a file of this experiment and task
        **states,
        # secrets of the config as their ${oc.env:NAME} text (trainer/secrets.py)
        "hyper_parameters": redact(encode(hparams, "hyper_parameters"), t.config_secrets),
        "config": redact(t.resolved_config, t.config_secrets),  # the run config that built this trainer
    }
    ckpt.update(_forms(task, form, ""))
    if ranks is None:
        ckpt.update(t.state.state_dict())
    else:
        ckpt.update(t.state.state_dict(ranks=ranks))
        # what a ReduceLROnPlateau needs when resuming from inside an epoch's end
        ckpt["loop"]["callback_metrics"] = {k: v.detach().cpu() for k, v in t.callback_metrics.items()}
        ckpt.update(
            lr_schedulers=[c.scheduler.state_dict() for c in t.lr_scheduler_configs],
            strategy=t.strategy.state_dict(),
            callbacks={cb.state_key: cb.state_dict() for cb in t.callbacks},
        )
        if t.datamodule is not None:
            with t.profile(action_key(t.datamodule, "state_dict")):
                ckpt["datamodule"] = t.datamodule.state_dict()
            hparams, form = plain_hparams(t.datamodule.hparams)
            ckpt["datamodule_hyper_parameters"] = redact(
                encode(hparams, "datamodule hparams"), t.config_secrets
            )
            ckpt.update(_forms(t.datamodule, form, "datamodule_"))
        t.hooks.call("on_save_checkpoint", ckpt)
    return ckpt


def _forms(owner: Any, form: str | None, prefix: str) -> dict[str, Any]:
    """Lightning's hparams_name (the __init__ argument that took the hyperparameters as one object) and
    hparams_type ("DictConfig"), as plain strings, where they apply."""
    out: dict[str, Any] = {}
    name = owner.__dict__.get("_hparams_name")
    if name is not None and owner.hparams:
        out[f"{prefix}hparams_name"] = name
    if form is not None:
        out[f"{prefix}hparams_type"] = form
    return out


@dataclass
class Restoring:
    """A checkpoint read for restoring, after its on_load_checkpoint hooks ran (they may have edited it)."""

    path: str
    ckpt: dict[
        str, Any
    ]  # a file's whole dict; a directory's non-tensor part (its weights stay in the shards)


def prepare_restore(t: Trainer, path: str, stage: str, weights_only: bool = True) -> Restoring:
    """Read `path` (a file or a directory, "best"/"last" already chosen by find.choose; a file as plain data unless `weights_only` is
    False) and restore what Lightning restores before the optimizers exist: the task's on_load_checkpoint
    (which may rename or drop keys of checkpoint["state_dict"]), then the weights, the DataModule's state,
    the callbacks' on_load_checkpoint and their states (a finetuning callback rebuilds its parameter groups
    from them in on_fit_start)."""
    wait_written(path)  # a checkpoint this process is still writing in the background (AsyncCheckpointIO)
    path = _existing(path)
    check_same_file_everywhere(t, path)
    task, io = t.task, checkpoint_io(t.strategy)
    assert task is not None
    ckpt = _read_meta(path)[0] if os.path.isdir(path) else io.load_checkpoint(path, weights_only=weights_only)
    if overrides(task, "on_load_checkpoint"):
        task.on_load_checkpoint(ckpt)
    loaded = io.restore(path, task, None, ckpt)
    ckpt = {**ckpt, "state_dict": loaded["state_dict"]}
    _warn_hparams(t, ckpt, path)
    restore_callbacks(t, ckpt, stage)
    if stage != "fit":
        t.print(f"Restored from {path} (epoch {ckpt['epoch']}, step {ckpt['global_step']})")
    return Restoring(path, ckpt)


def restore_callbacks(t: Trainer, ckpt: dict[str, Any], stage: str) -> None:
    """The DataModule's state, the callbacks' on_load_checkpoint and their states."""
    if resumable(ckpt) and t.datamodule is not None and "datamodule" in ckpt:
        with t.profile(action_key(t.datamodule, "load_state_dict")):
            t.datamodule.load_state_dict(ckpt["datamodule"])
    for cb in t.callbacks:
        if overrides(cb, "on_load_checkpoint"):
            cb.on_load_checkpoint(t, t.task, ckpt)
    if resumable(ckpt):
        states = ckpt.get("callbacks", {})
        for cb in t.callbacks:
            if states.get(cb.state_key):  # (Lightning's rule: an empty or None state is not loaded)
                cb.load_state_dict(states[cb.state_key])
        lost = [k for k, v in states.items() if v and k not in {cb.state_key for cb in t.callbacks}]
        if lost and stage == "fit" and t.is_global_zero:  # (Lightning warns too)
            warnings.warn(
                f"the checkpoint holds the state of callbacks this Trainer does not have, which is not "
                f"restored: {lost}. Pass the same callbacks as the run that wrote it to resume them.",
                UserWarning,
                stacklevel=5,
            )


def expect_restore(t: Trainer, path: str, weights_only: bool = True) -> None:
    """Before setup: tell a task built on the meta device which weights `path` restores right after (their
    modules are then materialized without reset_parameters)."""
    task = t.task
    if task is not None and has_meta(task):
        expect(task, saved_names(_existing(path), weights_only))


def restore(t: Trainer, restoring: Restoring) -> None:
    """fit, after on_fit_start (as Lightning): the optimizer, scheduler and loop states of the checkpoint."""
    path, ckpt, task = restoring.path, restoring.ckpt, t.task
    assert task is not None
    if resumable(ckpt):
        # Lightning's strategy hooks: `lightning_restore_optimizer` False skips the optimizers' states, an own
        # `load_optimizer_state_dict` loads them instead of the checkpoint-IO plugin
        s = t.strategy
        own = s.lightning_restore_optimizer and overrides(s, "load_optimizer_state_dict")
        optimizers = t.optimizers if s.lightning_restore_optimizer and not own else None
        checkpoint_io(s).restore(path, task, optimizers, ckpt, weights=False)
        if own:
            s.load_optimizer_state_dict(ckpt)
        restore_training(t, ckpt)
    t.print(f"Restored from {path} (epoch {t.current_epoch}, step {t.global_step})")


def restore_training(t: Trainer, ckpt: dict[str, Any], loop: bool = True) -> None:
    """The schedulers', the strategy's and (with `loop`) the loop's states; the optimizers' are restored."""
    for cfg, state in zip(t.lr_scheduler_configs, ckpt["lr_schedulers"]):
        cfg.scheduler.load_state_dict(state)
    t.strategy.load_state_dict(ckpt.get("strategy", {}))
    if not loop:
        return
    _restore_loop(t, ckpt)
    if t.is_global_zero:  # the step its loggers write next (trainer/loggers/reporting.py)
        for lg in t.loggers:
            getattr(lg, "resumed_at", lambda step: None)(t.global_step)


def _warn_hparams(t: Trainer, ckpt: dict[str, Any], path: str) -> None:
    """Warn (rank 0) listing the hyperparameters that differ between the checkpoint and the task."""
    assert t.task is not None
    saved = ckpt.get("hyper_parameters") or {}
    own = without_pickles(
        redact(encode(plain_hparams(t.task.hparams)[0], "hyper_parameters"), t.config_secrets)
    )
    saved = without_pickles(saved)
    differ = sorted(str(k) for k in {*saved, *own} if not _same(saved.get(k, _ABSENT), own.get(k, _ABSENT)))
    if differ and t.is_global_zero:
        shown = ", ".join(f"{k}: {saved.get(k, '<absent>')!r} -> {own.get(k, '<absent>')!r}" for k in differ)
        warnings.warn(
            f"checkpoint {path!r} was saved with other hyperparameters than this task's ({shown}); "
            "the restored weights and state were trained with the saved ones.",
            UserWarning,
            stacklevel=3,
        )


_ABSENT = object()


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # tensors and arrays compare element-wise
        return repr(a) == repr(b)


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
    state.load_state_dict(ckpt, t.global_rank)  # window_grads go back after fit's zero_grad (loop/fit.py)
    if state.epoch_finished:  # saved during the epoch's end, before its schedulers stepped: finish it
        if task.automatic_optimization:
            t.metric_store.callback_metrics.update(ckpt["loop"].get("callback_metrics", {}))
            # the fresh optimizer has not stepped yet, so torch's order warning does not apply
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step")
                step_schedulers(t, "epoch", plateau=True)  # the others stepped after the last batch
        state.next_epoch()
    max_epochs = t.config.max_epochs
    if max_epochs not in (None, -1) and state.epoch > max_epochs:  # (Lightning refuses it too)
        raise ConfigError(
            f"the checkpoint is at epoch {state.epoch}, past Trainer(max_epochs={max_epochs}): raise max_epochs "
            "to train on from it, or load only its weights (Task.load_from_checkpoint)."
        )


def rebuild_task(
    cls: type,
    path: str,
    map_location: Any,
    strict: bool | None,
    overrides: dict[str, Any],
    weights_only: bool = True,
    hparams_file: str | None = None,
) -> Any:
    """Task.load_from_checkpoint: cls(**saved hyperparameters, **overrides) with the saved weights; with
    `hparams_file` (Lightning's), that file's hyperparameters replace the saved ones. Inside
    ``Trainer.init_module(empty_init=True)`` under a sharding strategy the task is built on the meta device
    and the file only memory-mapped: its weights wait on the task and go in at setup, as shards."""
    on_meta = torch.get_default_device().type == "meta"
    where = map_location if map_location is not None else "cpu"
    ckpt = load(path, where, mmap=on_meta and os.path.isfile(path), weights_only=weights_only)
    if hparams_file is not None:
        from trainer.loggers.hparams_file import load_hparams_file

        ckpt["hyper_parameters"] = dict(load_hparams_file(hparams_file))
    # Lightning's older keys first ("hparams", "module_arguments"), the current one winning
    hparams = {
        **(ckpt.get("hparams") or {}),
        **(ckpt.get("module_arguments") or {}),
        **(ckpt.get("hyper_parameters") or {}),
    }
    if "_instantiator" in hparams:  # a LightningCLI run's: rebuilt from the config it saved
        from trainer.cli.instantiate import rebuild

        return _load_weights(rebuild(cls, hparams, overrides, path), ckpt, path, map_location, strict)
    name = ckpt.get("hparams_name")
    if not (isinstance(name, str) and name != "kwargs"):  # spread as keywords: only those __init__ takes
        hparams = _accepted(cls, hparams)
    overrides = _accepted(cls, overrides, warn=True)
    absent = {k: v for k, v in missing(hparams, not weights_only).items() if k not in overrides}
    for k in unresolved(
        hparams
    ):  # a secret stored as its ${oc.env:NAME} text: not read from this environment
        if k not in overrides:
            absent[k] = f"{hparams[k]!r}, a secret that is not stored"
    if absent:
        raise CheckpointError(
            f"checkpoint {path!r} could not store hyperparameters {absent}; pass them: "
            f"{cls.__name__}.load_from_checkpoint(path, {', '.join(f'{k}=...' for k in absent)})"
        )
    kept = decode_for(cls, {k: v for k, v in hparams.items() if k not in overrides}, path, not weights_only)
    task = cls(**{**rebuilt_form(cls, ckpt, kept, ""), **overrides})
    return _load_weights(task, ckpt, path, map_location, strict)


def _load_weights(task: Any, ckpt: dict[str, Any], path: str, map_location: Any, strict: bool | None) -> Any:
    """The checkpoint's weights into a task built from its hyperparameters (load_from_checkpoint)."""
    cls = type(task)
    task.configure_model()  # a task that builds layers lazily needs them before the weights load
    task.on_load_checkpoint(ckpt)  # before the weights, as Lightning: it may rename or drop their keys
    own = task._strict_loading  # set by the task itself (None: not set)
    if own is not None and strict is not None and strict != task.strict_loading:
        raise ConfigError(
            f"load_from_checkpoint(strict={strict!r}) contradicts {cls.__name__}.strict_loading="
            f"{task.strict_loading!r} set by the task; pass the same value, or leave strict=None to use the task's."
        )
    if strict is None:
        strict = task.strict_loading
    if strict:
        check_compatible(task, ckpt["state_dict"], path)
    if has_meta(task):  # nothing to copy into yet: loaded when the strategy has materialized the task
        defer(task, ckpt["state_dict"], strict, path)
        return task
    task.load_state_dict(ckpt["state_dict"], strict=strict)
    if not ckpt["state_dict"]:  # as Lightning: said, not refused (a task whose weights are all built later)
        warnings.warn(
            f"checkpoint {path!r} holds no parameters (an empty state_dict): the task keeps the weights "
            "its __init__ gave it.",
            UserWarning,
            stacklevel=3,
        )
    if isinstance(map_location, (str, torch.device)):
        task.to(map_location)
    return task


def _accepted(cls: type, values: dict[str, Any], warn: bool = False) -> dict[str, Any]:
    """`values` without the names `cls.__init__` does not take (all of them when it takes ``**kwargs``), as
    Lightning filters them; with `warn`, each dropped one is said (a keyword passed to load_from_checkpoint)."""
    import inspect

    params = inspect.signature(cls.__init__).parameters  # type: ignore[misc]
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return values
    dropped = [k for k in values if k not in params]
    if dropped and warn:
        warnings.warn(
            f"{cls.__name__}.load_from_checkpoint: {dropped} are not arguments of {cls.__name__}.__init__ and are "
            "ignored (as in Lightning).",
            UserWarning,
            stacklevel=4,
        )
    return {k: v for k, v in values.items() if k not in dropped}


def check_window_saves(t: Trainer, val_every: int) -> None:
    """Refuse, before training, a validation inside accumulation windows where the strategy cannot save
    one (ModelCheckpoint on validation, or a stop signal during it, would fail there mid-run)."""
    k = t.config.accumulate_grad_batches
    automatic = t.task is not None and t.task.automatic_optimization
    if automatic and k > 1 and val_every % k and not checkpoint_io(t.strategy).saves_window_grads:
        raise ConfigError(
            f"strategy={t.strategy.name!r} cannot save a checkpoint inside a gradient accumulation window, "
            f"but validation every {val_every} training batches falls inside windows of "
            f"accumulate_grad_batches={k}: make val_check_interval a multiple of {k}."
        )


def finish(t: Trainer, error: BaseException | None) -> None:
    """A stage ends: the strategy's checkpoint plugin finishes what it still writes (AsyncCheckpointIO waits for
    its last save). Its failure is raised, naming the file; when the stage failed already, it is printed on
    stderr instead, so that the stage's own error stays the one raised."""
    io = getattr(t.strategy, "checkpoint_io", None)
    if io is None:
        return
    try:
        io.teardown()
    except CheckpointError as e:
        if error is None:
            raise
        print(f"[tandem] {e}", file=sys.stderr)
        return
    if error is None and t.world_size > 1 and getattr(io, "writes_directory", False):
        t.strategy.comm.barrier("checkpoints published")  # rank 0 renames them into place: seen by every rank
