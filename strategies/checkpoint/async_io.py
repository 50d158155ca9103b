"""``AsyncCheckpointIO``: Lightning's plugin that writes checkpoints in the background, so that training goes on
while a checkpoint is written. It writes the strategy's own form: one file (rank 0, in a thread) or, for
sharded strategies, a directory of every rank's shards through torch's DCP (staged and saved as
``dcp.async_save`` does, the save in this plugin's writer thread).

- **A snapshot first.** Before a save returns, every tensor is copied into host buffers that are kept from
  one save to the next (torch's checkpoint stagers: the first save allocates them, later ones copy into
  them), so the caller may change the weights at once.
- **At most one training state in flight.** A save of a newer state first waits until the previous one is
  written (and raises its error, naming the file). Saves of the state already in flight (ModelCheckpoint's
  top-k file and ``last.ckpt`` of one step) share its snapshot and are written after it, without waiting.
- **Visible only when complete.** A file is written under a temporary name, fsynced and renamed; a directory
  is written as ``<path>.tmp-*`` and renamed into place by rank 0 once every rank's shards and DCP's metadata
  are on disk. A process killed mid-write leaves the previous checkpoint of that name loadable (and the
  temporary files, deleted by the next save of that name).
- **Nothing read half-written.** Loading or removing a checkpoint this process is still writing waits for
  it (tandem_core.fileio.wait_written).
- **Errors are not lost.** A failed write is raised, naming the file, at the next save or at ``teardown``
  (the end of every stage), which also waits for the last save.
- **One writer thread.** Every write (a file's ``torch.save``, a directory's ``dcp.save`` of the staged copy, as
  ``dcp.async_save`` runs it) runs in this plugin's one writer thread. ``writer_nice=19`` makes that thread (only
  it: the process keeps its priority) yield the cores to training on Linux; the default leaves it at the
  process's priority, because a starved writer that has not finished by the next save makes that save wait
  for it (docs/large_models.md, "Asynchronous checkpoints", measured both ways).
"""

from __future__ import annotations

import copy
import os
import shutil
import sys
import threading
import uuid
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from strategies.checkpoint.directory import dir_payload, publish_dir, temp_dir
from strategies.checkpoint.io import CheckpointIO, TorchCheckpointIO
from tandem_core.errors import CheckpointError
from tandem_core.fileio import remove_stale_temps, wait_written, writing

if TYPE_CHECKING:
    from strategies.comm import Comm


@dataclass
class _Write:
    path: str
    done: Future[Any]
    reads: str | None = None  # the checkpoint it copies (a directory published twice)


class AsyncCheckpointIO(CheckpointIO):
    """Write checkpoints in the background (Lightning's ``AsyncCheckpointIO``), for single files and, under
    fsdp and model_parallel, for directories of shards (DCP, as ``dcp.async_save``). Example::

        Trainer(plugins=[AsyncCheckpointIO()], callbacks=[ModelCheckpoint(save_last=True)]).fit(task)
        Trainer(strategy="fsdp", devices=4, plugins=[AsyncCheckpointIO()])  # sharded: DCP

    `checkpoint_io` is the plugin that writes each file (the strategy's own when None). `writer_nice`: the nice
    value (0 to 19) the writer thread gives itself on Linux, so that it competes less with training for the
    cores (worth it where a write ends well before the next save); None (the default) leaves it at the
    process's (elsewhere it always is).
    """

    def __init__(self, checkpoint_io: CheckpointIO | None = None, writer_nice: int | None = None) -> None:
        if writer_nice is not None and (
            isinstance(writer_nice, bool) or not isinstance(writer_nice, int) or not 0 <= writer_nice <= 19
        ):
            raise CheckpointError(
                f"AsyncCheckpointIO(writer_nice={writer_nice!r}): give a nice value from 0 (the process's priority "
                "or higher) to 19 (the lowest), or None to leave the writer thread's priority alone."
            )
        self.writer_nice = writer_nice
        self._checkpoint_io = checkpoint_io
        self._base_checkpoint_io_configured = checkpoint_io is not None and (
            not isinstance(checkpoint_io, AsyncCheckpointIO) or checkpoint_io._base_checkpoint_io_configured
        )
        #: the form written (set when attached to a strategy whose form is not `checkpoint_io` itself)
        self.form: TorchCheckpointIO | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._stager: Any = None  # torch's StateDictStager (files) or DefaultStager (directories)
        self._group: Any = None  # the process group DCP's background save communicates on
        self._writes: list[_Write] = []  # the state in flight: its writes, oldest first
        self._sources: dict[int, tuple[Any, int, Any]] = {}  # its tensors' storages: (storage, version, copy)

    def __getstate__(self) -> dict[str, Any]:
        """Picklable (ddp_spawn sends the trainer to its workers): without the writer, buffers and saves."""
        if self._writes:
            raise CheckpointError(
                "an AsyncCheckpointIO with a save in flight cannot be pickled; teardown() first."
            )
        state = dict(self.__dict__)
        state.update(_pool=None, _stager=None, _group=None)
        return state

    # ----- Lightning's wrapper: the plugin that writes each file ---------------------------------------
    @property
    def checkpoint_io(self) -> CheckpointIO | None:
        """The plugin that writes each file (Lightning's base checkpoint_io)."""
        return self._checkpoint_io

    @checkpoint_io.setter
    def checkpoint_io(self, io: CheckpointIO) -> None:
        if self._checkpoint_io is None:
            self._checkpoint_io, self._base_checkpoint_io_configured = io, True
        elif isinstance(self._checkpoint_io, AsyncCheckpointIO) and not self._base_checkpoint_io_configured:
            self._base_checkpoint_io_configured = True
            self._checkpoint_io.checkpoint_io = io

    @property
    def innermost(self) -> AsyncCheckpointIO:
        """The last AsyncCheckpointIO of a chain of them (the one whose checkpoint_io writes files)."""
        inner = self
        while isinstance(inner._checkpoint_io, AsyncCheckpointIO):
            inner = inner._checkpoint_io
        return inner

    def _target(self) -> TorchCheckpointIO:
        """The form written: what collects the states and writes each file."""
        if self.form is not None:
            return self.form
        base = self._checkpoint_io
        if isinstance(base, AsyncCheckpointIO):
            return base._target()
        if isinstance(base, TorchCheckpointIO):
            return base
        self.form = TorchCheckpointIO()  # (not attached to a strategy: a plain file, through `base`)
        self.form.file_io = base
        return self.form

    # ----- the form's protocol: everything but the write is the wrapped form's ------------------------
    @property
    def mmap(self) -> bool:
        """Whether checkpoint files are read memory-mapped (the form's choice)."""
        return self._target().mmap

    @property
    def saves_window_grads(self) -> bool:
        """Whether the form can save inside an accumulation window."""
        return self._target().saves_window_grads

    @property
    def writes_directory(self) -> bool:
        """Whether the form writes a directory of shards (then through DCP)."""
        return self._target().writes_directory

    def __getattr__(self, name: str) -> Any:
        if name in ("collect", "restore", "load_file", "window_grads", "set_window_grads", "full"):
            return getattr(self._target(), name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def write(self, ckpt: dict[str, Any], path: str, comm: Comm) -> None:
        """The form's write, in the background: returns once the states are copied (see the module)."""
        if self.writes_directory:
            self._write_dir(ckpt, path, comm)
        elif comm.is_global_zero:
            self.save_checkpoint(ckpt, path)

    # ----- Lightning's plugin interface ---------------------------------------------------------------
    def save_checkpoint(self, checkpoint: dict[str, Any], path: str, storage_options: Any = None) -> None:
        """Copy `checkpoint`'s tensors, then write it to `path` in the background (one file)."""
        path = os.fspath(path)
        self._raise_failed()
        same = bool(self._writes) and not self._changed(checkpoint)
        if self._writes and not same:
            self.wait()  # at most one training state in flight
        if self._stager is None:
            from torch.distributed.checkpoint._state_dict_stager import StateDictStager

            self._stager = StateDictStager(pin_memory=torch.cuda.is_available(), share_memory=False)
        memo: dict[int, Any] = {}
        if same:  # the state in flight: its copies are shared, not made again
            memo = {key: staged for key, (_, _, staged) in self._sources.items()}
        snapshot = self._stager.deepcopy_with_tensor_offload(checkpoint, memo)
        self._remember(checkpoint, snapshot)
        target = self._checkpoint_io if isinstance(self._checkpoint_io, AsyncCheckpointIO) else self._target()
        self._submit(path, self._write_file, target, snapshot, path, storage_options)

    def load_checkpoint(
        self, path: str, map_location: Any = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        """The checkpoint at `path`, once any write of it by this process has finished."""
        wait_written(path)
        return self._target().load_checkpoint(path, map_location, weights_only)

    def remove_checkpoint(self, path: str) -> None:
        """Delete `path` once no write of it (or copy from it) by this process is in flight."""
        key = os.path.abspath(os.fspath(path))
        wait([w.done for w in self._writes if key in (os.path.abspath(w.path), w.reads)])
        self._target().remove_checkpoint(path)

    def teardown(self) -> None:
        """Wait for the last save and raise its error; free the copies' buffers and the writer thread."""
        try:
            self.wait()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
            if self._stager is not None and hasattr(self._stager, "close"):
                self._stager.close()
            # (the group too: a gloo group still held by a live plugin at interpreter exit outlives the
            # world's close there, strategies/group_exit.py; the next directory save makes a new one)
            self._pool, self._stager, self._group = None, None, None
            inner = self._checkpoint_io
            if isinstance(inner, AsyncCheckpointIO):
                inner.teardown()

    def wait(self) -> None:
        """Block until every save in flight is written; raise the first failure, naming its file."""
        writes, self._writes, self._sources = self._writes, [], {}
        wait([w.done for w in writes])
        _raise_first([w for w in writes if w.done.exception() is not None])

    # ----- inside -------------------------------------------------------------------------------------
    def _raise_failed(self) -> None:
        failed = [w for w in self._writes if w.done.done() and w.done.exception() is not None]
        if failed:
            self._writes = [w for w in self._writes if w not in failed]
            _raise_first(failed)

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:  # one writer: saves are written in the order they were made
            self._pool = ThreadPoolExecutor(
                max_workers=1,
                thread_name_prefix="tandem-checkpoint",
                initializer=_lower_priority,
                initargs=(self.writer_nice,),
            )
        return self._pool

    def _submit(self, path: str, fn: Any, *args: Any, reads: str | None = None) -> None:
        done = self._executor().submit(fn, *args)
        self._writes.append(_Write(path, done, reads))
        writing(path, done)

    @staticmethod
    def _write_file(target: CheckpointIO, snapshot: dict[str, Any], path: str, options: Any) -> None:
        remove_stale_temps(path)  # what a process killed while writing `path` left
        target.save_checkpoint(snapshot, path, options)

    def _changed(self, state: Any) -> bool:
        """Whether `state` differs from the state in flight: one of its tensors was modified since."""
        for t in _tensors(state):
            seen = self._sources.get(id(t.untyped_storage()))
            if seen is not None and seen[1] != t._version:
                return True
        return False

    def _remember(self, state: Any, snapshot: Any) -> None:
        """Record each source storage of the state in flight with its version and its copy."""
        for src, dst in zip(_tensors(state), _tensors(snapshot)):
            storage = src.untyped_storage()
            self._sources.setdefault(id(storage), (storage, src._version, dst.untyped_storage()))

    def _write_dir(self, ckpt: dict[str, Any], path: str, comm: Comm) -> None:
        """A directory of shards, as dcp.async_save writes it; rank 0 renames it into place when complete."""
        import torch.distributed as dist
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        tensors, meta = dir_payload(ckpt)
        self._raise_failed()
        changed = not self._writes or self._changed(tensors)
        same = not (comm.any_rank(changed) if comm.world_size > 1 else changed)  # every rank decides alike
        meta = copy.deepcopy(meta)  # (small: loop, callbacks, hyperparameters)
        if same:  # the state in flight, published once more: rank 0 copies the directory it wrote
            if comm.is_global_zero:
                first = os.path.abspath(self._writes[0].path)
                self._submit(path, _copy_dir, first, meta, os.path.abspath(path), reads=first)
            return
        self.wait()  # at most one training state in flight (every rank)
        tmp = temp_dir(path, comm)
        if self._stager is None:
            cuda = torch.cuda.is_available()
            self._stager = DefaultStager(StagingOptions(cuda, False, False, False))
        distributed = dist.is_available() and dist.is_initialized()
        if distributed and self._group is None:  # DCP's collectives in the background: a group of their own
            self._group = dist.new_group(backend="gloo")
        # dcp.async_save's thread-based form, with the write in this plugin's own (lower-priority) thread: the
        # host copy here, before returning; dcp.save of the copy in the writer (its collectives on `_group`)
        staged = self._stager.stage(tensors)
        self._remember(tensors, staged)
        publish = (os.path.abspath(path), meta) if comm.is_global_zero else None
        self._submit(path, _save_dir, staged, tmp, self._group, publish)


def _save_dir(
    staged: dict[str, Any], tmp: str, group: Any, publish: tuple[str, dict[str, Any]] | None
) -> None:
    """Every rank's shards of `staged` into `tmp` (dcp.save, a collective over `group`); on rank 0 (`publish`:
    the path and the checkpoint's other contents) the directory renamed into place once complete: DCP's save
    returns on the coordinator after every rank's shards and the metadata are written."""
    import torch.distributed.checkpoint as dcp

    dcp.save(staged, checkpoint_id=tmp, process_group=group)
    if publish is not None:
        publish_dir(tmp, publish[1], publish[0])


def _lower_priority(nice: int | None) -> None:
    """The writer thread's start: its own nice value raised to `nice` on Linux (a thread id names one thread
    there; the process and its other threads keep theirs). Nothing elsewhere, or when not allowed."""
    if nice is None or not sys.platform.startswith("linux"):
        return
    tid = threading.get_native_id()
    try:
        if os.getpriority(os.PRIO_PROCESS, tid) < nice:
            os.setpriority(os.PRIO_PROCESS, tid, nice)
    except OSError:  # (a sandbox refusing it: the write just keeps the process's priority)
        pass


def _copy_dir(src: str, meta: dict[str, Any], path: str) -> None:
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:12]}"
    shutil.copytree(src, tmp)
    publish_dir(tmp, meta, path)


def _tensors(obj: Any) -> list[torch.Tensor]:
    """The tensors in nested dicts, lists and tuples, in order (a DTensor's local shard)."""
    from torch.distributed.tensor import DTensor

    out: list[torch.Tensor] = []
    stack = [obj]
    while stack:
        x = stack.pop()
        if isinstance(x, DTensor):
            out.append(x._local_tensor)
        elif isinstance(x, torch.Tensor):
            out.append(x)
        elif isinstance(x, dict):
            stack.extend(reversed(list(x.values())))
        elif isinstance(x, (list, tuple)):
            stack.extend(reversed(x))
    return out


def _raise_first(failed: list[_Write]) -> None:
    if failed:
        w = failed[0]
        e = w.done.exception()
        raise CheckpointError(
            f"the background save of checkpoint {w.path!r} failed ({type(e).__name__}: {e}); "
            "the previous checkpoint of that name, if any, is unchanged."
        ) from e
