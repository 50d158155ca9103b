"""How weights and optimizer states get into and out of a checkpoint, in its two forms, and Lightning's
checkpoint-IO plugin interface (``CheckpointIO``: save, load and remove one checkpoint).

- **A file**: one ``torch.save`` of the whole checkpoint dict, written atomically by rank 0 (the default,
  ``TorchCheckpointIO``).
- **A directory** written with torch.distributed.checkpoint (DCP): every rank writes its own shards of the
  weights and optimizer states, rank 0 adds ``tandem.pt`` with everything else. It is written under a
  temporary name and renamed into place only after every rank has finished; the previous checkpoint of
  that name stays until then.

Every strategy reads both, as plain data only: files with torch.load(weights_only=True), directories
through strategies/checkpoint/dcp_read.py. Loading a directory reshards: DCP gives each rank the parts of the saved tensors
that its own tensors (sharded or whole) cover, so a run saved by N processes resumes on any other number.

A form is a ``TorchCheckpointIO``: besides Lightning's three file operations it says what a checkpoint holds
(``collect``), who writes which part (``write``) and how it is read back (``restore``). A strategy keeps its
form in ``strategy.checkpoint_io`` (FSDP's writes directories, ZeRO-1's and the pipeline's gather to rank 0);
a user's own ``CheckpointIO`` (plugins=[...]) takes over the file operations of that form, and
``AsyncCheckpointIO`` (strategies/checkpoint/async_io.py) writes it in the background
(strategies/checkpoint/plugins.py attaches either).
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

import torch

from strategies.checkpoint.checks import _check_count, check_compatible, check_contents, resumable
from strategies.checkpoint.directory import (
    _existing,
    _options,
    _read_meta,
    _saved_weights,
    dir_payload,
    discard,
    read_dir,
    restore_dir,
    sharded_states,
    write_dir,
)
from strategies.checkpoint.files import atomic_save, read
from strategies.checkpoint.remote import fetch, is_http
from tandem_core.errors import CheckpointError, CheckpointNotFoundError
from tandem_core.fileio import wait_written

if TYPE_CHECKING:
    from strategies.comm import Comm


class CheckpointIO(ABC):
    """Lightning's checkpoint-IO plugin: how one checkpoint (a dict) is saved to, loaded from and removed at
    a path. Subclass it and pass ``Trainer(plugins=[MyIO()])`` (or set ``strategy.checkpoint_io``) to write
    checkpoints your own way; the strategy still decides what the dict holds. Example::

        class Copying(CheckpointIO):
            def save_checkpoint(self, checkpoint, path, storage_options=None):
                TorchCheckpointIO().save_checkpoint(checkpoint, path); shutil.copy(path, "/backup/")
            def load_checkpoint(self, path, map_location=None, weights_only=None):
                return TorchCheckpointIO().load_checkpoint(path, map_location, weights_only)
            def remove_checkpoint(self, path):
                TorchCheckpointIO().remove_checkpoint(path)
    """

    @abstractmethod
    def save_checkpoint(self, checkpoint: dict[str, Any], path: str, storage_options: Any = None) -> None:
        """Write `checkpoint` to `path` (called on rank 0 only)."""

    @abstractmethod
    def load_checkpoint(
        self, path: str, map_location: Any = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        """Read the checkpoint at `path` (weights_only=None: Tandem's default, plain data only)."""

    @abstractmethod
    def remove_checkpoint(self, path: str) -> None:
        """Delete the checkpoint at `path` (a file, or a directory of shards)."""

    def teardown(self) -> None:  # noqa: B027 (optional, as in Lightning: a plugin may have nothing to finish)
        """Called when a stage ends (finish what is still being written)."""


def checkpoint_io(strategy: Any) -> TorchCheckpointIO:
    """What writes and reads the strategy's checkpoints: an AsyncCheckpointIO assigned to it (it stands in
    for the form it writes), else its form (the default single file unless the strategy set its own, with a
    user's CheckpointIO doing its file operations); strategies/checkpoint/plugins.py attaches them."""
    own = strategy.__dict__
    public = own.get("_checkpoint_io")
    if public is not None and callable(getattr(type(public), "write", None)):  # AsyncCheckpointIO
        return public  # type: ignore[no-any-return]
    form = own.get("_checkpoint_form")
    if form is None:
        form = own["_checkpoint_form"] = TorchCheckpointIO()
    return form  # type: ignore[no-any-return]


def plugin_of(strategy: Any) -> CheckpointIO:
    """`strategy.checkpoint_io` as Lightning reads it: what was assigned, else the form."""
    return strategy.__dict__.get("_checkpoint_io") or checkpoint_io(strategy)


class TorchCheckpointIO(CheckpointIO):
    """One file written by rank 0 with the task's and the optimizers' own ``state_dict()``: ``torch.save``
    to a temporary file renamed into place, read back with ``torch.load(weights_only=True)`` after the
    file's records were checked. Lightning's default checkpoint-IO plugin, and the default form."""

    mmap = False  # read files memory-mapped (each rank then keeps only what it copies out)
    saves_window_grads = True  # False: no checkpoint can be taken inside an accumulation window
    writes_directory = False  # True: every rank writes its shards with DCP (not one file)
    #: a user's CheckpointIO that does this form's file operations (strategies/checkpoint/plugins.py)
    file_io: CheckpointIO | None = None

    # ----- Lightning's plugin interface: one file ------------------------------------------------------
    def save_checkpoint(self, checkpoint: dict[str, Any], path: str, storage_options: Any = None) -> None:
        """torch.save `checkpoint` to `path` atomically (a crash leaves the previous file)."""
        if self.file_io is not None:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)  # (as the default write does)
            return self.file_io.save_checkpoint(checkpoint, path, storage_options)
        if storage_options is not None:
            raise TypeError(
                f"{type(self).__name__}.save_checkpoint takes no storage_options; write a CheckpointIO "
                "subclass that uses them."
            )
        atomic_save(checkpoint, path)
        return None

    def load_checkpoint(
        self, path: str, map_location: Any = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        """A checkpoint file or directory as plain data (see `load`); weights_only=None means True."""
        if self.file_io is not None and not os.path.isdir(path):
            return self.file_io.load_checkpoint(path, weights_only=weights_only)
        return load(path, map_location or "cpu", self.mmap, weights_only is not False)

    def remove_checkpoint(self, path: str) -> None:
        """Delete the checkpoint file, or a directory checkpoint with its shards."""
        if self.file_io is not None and not os.path.isdir(path):
            self.file_io.remove_checkpoint(path)
        else:
            discard(path)

    # ----- the form ------------------------------------------------------------------------------------

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
            self.save_checkpoint(ckpt, path)
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
            ckpt = self.load_checkpoint(path)
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
        """Put back the gradients of an accumulation window saved by `window_grads` (a resume mid-window)."""
        for p, g in zip(task.parameters(), grads):
            p.grad = None if g is None else g.to(p.device)


class ShardedCheckpointIO(TorchCheckpointIO):
    """States as torch.distributed.checkpoint.state_dict sees them, for sharded parameters: a directory of
    every rank's shards (the default), or with `full=True` one file of the states gathered to rank 0, in the
    same form as the default file (optimizer states keyed by parameter index), readable without a group."""

    mmap = True

    def __init__(self, full: bool = False) -> None:
        self.full = full

    @property
    def writes_directory(self) -> bool:  # type: ignore[override]
        return not self.full

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
        """The file's whole weights go to the sharded task from rank 0 alone (the file is memory-mapped on every
        rank, but only rank 0 reads its tensors: each is broadcast, and every rank keeps its shard of it, so
        no other rank holds more than its shards and one whole tensor); the optimizer states as every rank
        reads them from its memory map, keeping its own part."""
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        from strategies.large.weights import load_full

        opts = _options(full_state_dict=True)
        if weights:
            reader = not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0
            load_full(task, ckpt["state_dict"] if reader else {}, getattr(task, "strict_loading", True))
        for opt, state in zip(optimizers or [], ckpt.get("optimizer_states", [])):
            if not _has_tensor_state(state):
                # plain SGD, an optimizer that never stepped: only its param_groups, loaded as torch loads them
                # (torch's set_optimizer_state_dict would first fill every parameter's gradient with zeros and
                # step, holding a second copy of the shards for nothing)
                opt.load_state_dict(state)
                continue
            # torch shards a whole state onto the device of this rank's own state tensors
            set_optimizer_state_dict(task, opt, _by_name(state, _param_names(task, opt)), options=opts)


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
    wait_written(path)  # a save of it still in flight in this process (AsyncCheckpointIO)
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


def saved_names(path: str, weights_only: bool = True) -> set[str]:
    """The names of the weights a checkpoint (file or directory) holds, without reading the tensors (a file
    is memory-mapped; a directory's metadata lists them)."""
    path = _existing(path)
    if os.path.isdir(path):
        return set(_saved_weights(_read_meta(path)[1]))
    return set(load(path, mmap=True, weights_only=weights_only)["state_dict"])
