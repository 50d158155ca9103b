"""Lightning's checkpoint-IO plugins on a strategy: `strategy.checkpoint_io` (and `Trainer(plugins=[...])`,
which assigns it) with Lightning's meaning, joined to the form the strategy writes its checkpoints in.

A strategy's own form (a TorchCheckpointIO: FSDP's directories, ZeRO-1's and the pipeline's files gathered
to rank 0) is set by its constructor and stays. What a user assigns joins it:
- ``AsyncCheckpointIO(...)``: writes that form in the background; a wrapper whose innermost
  ``checkpoint_io`` is unset gets the strategy's form there (as Lightning's strategy fills in its default).
- any other ``CheckpointIO`` (the user's own, or a TorchCheckpointIO subclass): does the form's file
  operations (save, load, remove of one file); refused where the form writes directories of shards.
`strategy.checkpoint_io` then reads back what was assigned, as in Lightning.
"""

from __future__ import annotations

from typing import Any

from strategies.checkpoint.async_io import AsyncCheckpointIO
from strategies.checkpoint.io import CheckpointIO, TorchCheckpointIO, checkpoint_io, plugin_of
from tandem_core.errors import ConfigError

__all__ = [
    "AsyncCheckpointIO",
    "CheckpointIO",
    "TorchCheckpointIO",
    "attach",
    "checkpoint_io",
    "plugin_of",
    "use_form",
]


def use_form(strategy: Any, form: TorchCheckpointIO) -> None:
    """Make `form` the strategy's form (replacing the one it has), dropping any plugin assigned before."""
    strategy.__dict__["_checkpoint_form"] = form
    strategy.__dict__.pop("_checkpoint_io", None)


def attach(strategy: Any, io: CheckpointIO) -> None:
    """`strategy.checkpoint_io = io` (see the module's docstring)."""
    if not isinstance(io, CheckpointIO):
        raise ConfigError(
            f"checkpoint_io must be a CheckpointIO (strategies.checkpoint.plugins: TorchCheckpointIO, "
            f"AsyncCheckpointIO or your subclass of CheckpointIO), got {type(io).__name__}."
        )
    own = strategy.__dict__
    form = own.get("_checkpoint_form")
    if form is None and isinstance(io, TorchCheckpointIO):  # the strategy's own form (its constructor)
        own["_checkpoint_form"] = io
        own.pop("_checkpoint_io", None)
        return
    form = form or TorchCheckpointIO()
    own["_checkpoint_form"] = form
    if isinstance(io, AsyncCheckpointIO):
        base = io.innermost.checkpoint_io
        if base is None:  # Lightning's default filled in (its setter reaches the innermost): the form
            io.checkpoint_io = form
        elif type(base) is TorchCheckpointIO and base.file_io is None:  # the default, given: the form instead
            io.innermost.form = form
        elif base is not form:
            _file_io(strategy, form, base)
            io.innermost.form = form
    elif not (type(io) is TorchCheckpointIO and io.file_io is None):  # (the default adds nothing)
        _file_io(strategy, form, io)
    own["_checkpoint_io"] = io


def _file_io(strategy: Any, form: TorchCheckpointIO, io: CheckpointIO) -> None:
    """`io` does `form`'s file operations."""
    if form.writes_directory:
        raise ConfigError(
            f"{type(strategy).__name__} writes sharded checkpoints as directories (torch.distributed.checkpoint), "
            f"which a CheckpointIO such as {type(io).__name__} cannot write: save one gathered file instead "
            "(FSDPStrategy(save_full=True), ModelParallelStrategy(save_distributed_checkpoint=False)), or pass "
            "AsyncCheckpointIO() alone to write the directories in the background."
        )
    form.file_io = io
