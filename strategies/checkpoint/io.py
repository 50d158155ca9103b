"""How weights and optimizer states get into and out of a checkpoint, in its two forms.

- **A file**: one ``torch.save`` of the whole checkpoint dict, written atomically by rank 0 (the default).
- **A directory** written with torch.distributed.checkpoint (DCP): every rank writes its own shards of the
  weights and optimizer states, rank 0 adds ``tandem.pt`` with everything else. It is written under a
  temporary name and renamed into place only after every rank has finished; the previous checkpoint of
  that name stays until then.

Every strategy reads both, as plain data only: files with torch.load(weights_only=True), directories
through strategies/checkpoint/dcp_read.py. Loading a directory reshards: DCP gives each rank the parts of the saved tensors
that its own tensors (sharded or whole) cover, so a run saved by N processes resumes on any other number.
A strategy chooses how it writes through a `checkpoint_io` attribute (FSDPStrategy has one); the others
use `CheckpointIO()`.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import torch

from strategies.checkpoint.checks import _check_count, check_compatible, check_contents, resumable
from strategies.checkpoint.directory import (
    _existing,
    _options,
    dir_payload,
    read_dir,
    restore_dir,
    sharded_states,
    write_dir,
)
from strategies.checkpoint.files import atomic_save, read
from strategies.checkpoint.remote import fetch, is_http
from tandem_core.errors import CheckpointError, CheckpointNotFoundError

if TYPE_CHECKING:
    from strategies.comm import Comm


def checkpoint_io(strategy: Any) -> CheckpointIO:
    """The strategy's way of writing checkpoints, or the default single file."""
    return getattr(strategy, "checkpoint_io", None) or CheckpointIO()


class CheckpointIO:
    """One file written by rank 0 with the task's and the optimizers' own ``state_dict()``."""

    mmap = False  # read files memory-mapped (each rank then keeps only what it copies out)
    saves_window_grads = True  # False: no checkpoint can be taken inside an accumulation window

    def collect(
        self, task: torch.nn.Module, optimizers: list[torch.optim.Optimizer] | None
    ) -> dict[str, Any]:
        """The checkpoint's "state_dict" and (unless `optimizers` is None) "optimizer_states"."""
        out: dict[str, Any] = {"state_dict": task.state_dict()}
        if optimizers is not None:
            out["optimizer_states"] = [o.state_dict() for o in optimizers]
        return out

    def write(self, ckpt: dict[str, Any], path: str, comm: Comm) -> None:
        """Write `ckpt` to `path`; every rank calls this and returns once it is on disk."""
        if comm.is_global_zero:
            atomic_save(ckpt, path)
        comm.barrier("save_checkpoint")

    def restore(
        self,
        path: str,
        task: torch.nn.Module,
        optimizers: list[torch.optim.Optimizer] | None,
        ckpt: dict[str, Any] | None = None,
        weights: bool = True,
    ) -> dict[str, Any]:
        """Load `path` (either form) into the task (unless not `weights`) and, for a full checkpoint, into
        `optimizers` when given; return the checkpoint dict. `ckpt`: a file's dict already read (and edited
        by on_load_checkpoint)."""
        path = _existing(path)
        if os.path.isdir(path):
            return restore_dir(path, task, optimizers, weights)
        if ckpt is None:
            ckpt = load(path, mmap=self.mmap)
        if weights and getattr(task, "strict_loading", True):  # strict_loading=False: partial weights
            check_compatible(task, ckpt["state_dict"], path)
        if optimizers is not None and resumable(ckpt):
            _check_count(path, len(ckpt["optimizer_states"]), optimizers)
        self.load_file(ckpt, task, optimizers if resumable(ckpt) else None, weights)
        return ckpt

    def load_file(
        self,
        ckpt: dict[str, Any],
        task: torch.nn.Module,
        optimizers: list[torch.optim.Optimizer] | None,
        weights: bool = True,
    ) -> None:
        """Load a checkpoint file's states (already checked against the task) into task and optimizers."""
        if weights:
            task.load_state_dict(ckpt["state_dict"], strict=getattr(task, "strict_loading", True))
        for opt, state in zip(optimizers or [], ckpt.get("optimizer_states", [])):
            opt.load_state_dict(state)

    def window_grads(self, task: torch.nn.Module) -> list[torch.Tensor | None]:
        """This rank's gradients inside an unfinished accumulation window (saved per rank)."""
        return [None if p.grad is None else p.grad.detach().cpu().clone() for p in task.parameters()]

    def set_window_grads(self, task: torch.nn.Module, grads: list[torch.Tensor | None]) -> None:
        for p, g in zip(task.parameters(), grads):
            p.grad = None if g is None else g.to(p.device)


class ShardedCheckpointIO(CheckpointIO):
    """States as torch.distributed.checkpoint.state_dict sees them, for sharded parameters: a directory of
    every rank's shards (the default), or with `full=True` one file of the states gathered to rank 0, in the
    same form as the default file (optimizer states keyed by parameter index), readable without a group."""

    mmap = True

    def __init__(self, full: bool = False) -> None:
        self.full = full

    def collect(
        self, task: torch.nn.Module, optimizers: list[torch.optim.Optimizer] | None
    ) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

        if not self.full:
            model, optims = sharded_states(task, optimizers)
            return (
                {"state_dict": model}
                if optimizers is None
                else {"state_dict": model, "optimizer_states": optims}
            )
        opts = _options(full_state_dict=True, cpu_offload=True)  # rank 0 gets everything, the others nothing
        out: dict[str, Any] = {"state_dict": get_model_state_dict(task, options=opts)}
        if optimizers is not None:
            out["optimizer_states"] = [
                _by_index(get_optimizer_state_dict(task, o, options=opts), _param_names(task, o))
                for o in optimizers
            ]
        return out

    def write(self, ckpt: dict[str, Any], path: str, comm: Comm) -> None:
        if self.full:
            super().write(ckpt, path, comm)
        else:
            write_dir(*dir_payload(ckpt), path, comm)

    def load_file(
        self,
        ckpt: dict[str, Any],
        task: torch.nn.Module,
        optimizers: list[torch.optim.Optimizer] | None,
        weights: bool = True,
    ) -> None:
        """Every rank keeps its own part of the file's whole tensors (the file is memory-mapped)."""
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

        opts = _options(full_state_dict=True)
        if weights:
            set_model_state_dict(task, ckpt["state_dict"], options=opts)
        for opt, state in zip(optimizers or [], ckpt.get("optimizer_states", [])):
            # torch shards a whole state onto the device of this rank's own state tensors; a state without
            # any (plain SGD, an optimizer that never stepped) has only its param_groups: loaded as they are
            whole = opts if _has_tensor_state(state) else None
            set_optimizer_state_dict(task, opt, _by_name(state, _param_names(task, opt)), options=whole)


def _param_names(task: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The name of every parameter of `optimizer`, in the order its state_dict numbers them."""
    names = {id(p): n for n, p in task.named_parameters()}
    try:
        return [names[id(p)] for group in optimizer.param_groups for p in group["params"]]
    except KeyError as e:
        raise CheckpointError(
            "an optimizer holds a tensor that is not a parameter of the task; optimize only the task's "
            "parameters (self.parameters()) to checkpoint it."
        ) from e


def _has_tensor_state(state: dict[str, Any]) -> bool:
    """Whether an optimizer state holds a per-parameter tensor of at least one dimension (what torch's
    full-state loading shards), not only hyperparameters and scalars."""
    return any(
        isinstance(v, torch.Tensor) and v.dim() > 0
        for per_param in state.get("state", {}).values()
        for v in per_param.values()
    )


def _by_index(state: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """An optimizer state keyed by parameter name -> torch's own form, keyed by index."""
    if not state:  # not rank 0
        return state
    index = {n: i for i, n in enumerate(names)}
    return {
        "state": {index[n]: s for n, s in state["state"].items()},
        "param_groups": [{**g, "params": [index[n] for n in g["params"]]} for g in state["param_groups"]],
    }


def _by_name(state: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """torch's optimizer state, keyed by index -> keyed by parameter name."""
    return {
        "state": {names[i]: s for i, s in state["state"].items()},
        "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in state["param_groups"]],
    }


def load(
    path: str | os.PathLike[str], map_location: Any = "cpu", mmap: bool = False, weights_only: bool = True
) -> dict[str, Any]:
    """Read a checkpoint written by Trainer.save_checkpoint: a file, or a directory (its weights gathered
    whole into this process; its optimizer states are read only when resuming, by `restore`). Plain data
    only (torch.load's weights_only) unless weights_only=False is asked for a trusted file."""
    path = os.fspath(path)
    if is_http(path):  # Lightning's URL checkpoints: downloaded, then read as any file
        path = fetch(path)
    path = _existing(path)
    if os.path.isdir(path):
        return read_dir(path)
    if not os.path.lexists(path):
        raise CheckpointNotFoundError(
            f"checkpoint {path!r} does not exist; pass an existing file or ckpt_path='last'."
        )
    try:
        ckpt = read(path, map_location, weights_only, mmap)  # checks the file's kind and sizes first
    except CheckpointError:
        raise
    except Exception as e:
        raise CheckpointError(f"checkpoint {path!r} could not be read ({type(e).__name__}: {e}).") from e
    check_contents(ckpt, path)
    return ckpt
