"""What a checkpoint must be before any of it is read, and what its contents must hold once read.

Before reading: every file is a regular file (a named pipe would block the reader forever, a device would
stream without end), and no part declares more bytes than it stores. torch.save writes a zip whose records
are stored uncompressed, and torch's reader allocates what a record *declares* before it reads it, so a
crafted 1 MB file with a deflated record declaring 1.2 GB costs 1.2 GB: here each record must be stored, lie
inside the file, and all of them together fit in it. A directory (DCP) checkpoint's ``.metadata`` declares
every tensor's size and where its bytes are; each tensor must be covered by chunks whose bytes lie inside
regular data files of the directory (`check_storage`), and each chunk is itself such a zip (`check_zip`).
The limit is the data on disk: nothing may declare more than is stored.

After reading: `check_contents` checks the keys a restore uses (format version, weights are tensors,
optimizer states for a resume, numeric epoch and step), so a malformed file is a CheckpointError naming
the file and what is wrong, not a KeyError from deep inside.
"""

from __future__ import annotations

import io
import math
import os
import stat
import zipfile
from typing import IO, Any

import torch

from tandem_core.errors import CheckpointError, CheckpointNotFoundError, IncompatibleCheckpointError

FORMAT_VERSION = 2  # what save() writes as "tandem_version"; reading checks it
_KINDS = {
    stat.S_ISFIFO: "named pipe",
    stat.S_ISCHR: "character device",
    stat.S_ISBLK: "block device",
    stat.S_ISSOCK: "socket",
    stat.S_ISDIR: "directory",
    stat.S_ISLNK: "symbolic link",
}


def regular_file(path: str, what: str = "checkpoint", follow: bool = True) -> int:
    """The size of `path`, a regular file (through a symlink only when `follow`); else a CheckpointError."""
    try:
        st = os.stat(path) if follow else os.lstat(path)
    except FileNotFoundError:
        raise CheckpointNotFoundError(f"{what} {path!r} does not exist.") from None
    except OSError as e:
        raise CheckpointError(f"{what} {path!r} cannot be examined ({e}).") from e
    if not stat.S_ISREG(st.st_mode):
        kind = next((name for test, name in _KINDS.items() if test(st.st_mode)), "special file")
        raise CheckpointError(
            f"{what} {path!r} is a {kind}, not a regular file; Tandem reads checkpoints from regular files "
            "only (reading anything else could block or never end). Replace it with the file save_checkpoint "
            "wrote."
        )
    return st.st_size


class _Slice(io.RawIOBase):
    """`length` bytes of `base` from `offset`, as a seekable file (torch's own view mis-seeks from the end)."""

    def __init__(self, base: IO[bytes], offset: int, length: int) -> None:
        self.base, self.offset, self.length, self.pos = base, offset, length, 0

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def seek(self, pos: int, whence: int = os.SEEK_SET) -> int:
        start = {os.SEEK_SET: 0, os.SEEK_CUR: self.pos, os.SEEK_END: self.length}[whence]
        self.pos = min(max(start + pos, 0), self.length)
        return self.pos

    def tell(self) -> int:
        return self.pos

    def readinto(self, b: Any) -> int:
        view = memoryview(b)[: max(0, self.length - self.pos)]
        self.base.seek(self.offset + self.pos)
        n = self.base.readinto(view) or 0  # type: ignore[attr-defined]
        self.pos += n
        return n


def check_zip(f: IO[bytes], size: int, what: str, required: bool = True) -> None:
    """Every record of the zip in `f` (`size` bytes) is stored uncompressed and lies inside it."""
    try:
        with zipfile.ZipFile(_Slice(f, f.tell(), size)) as z:
            records = z.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as e:
        if not required:
            return
        raise CheckpointError(
            f"{what} is not in torch's zip format (torch.save's default, which Tandem writes) ({e}); "
            "save it again with trainer.save_checkpoint."
        ) from e
    total = 0
    for r in records:
        if r.compress_type != zipfile.ZIP_STORED or r.compress_size != r.file_size:
            raise CheckpointError(
                f"{what}: record {r.filename!r} is compressed, declaring {r.file_size} bytes in "
                f"{r.compress_size}; torch.save never compresses, and reading it would allocate the declared "
                "size first. This file was crafted or damaged: do not load it."
            )
        total += r.file_size
        if r.header_offset + r.file_size > size or total > size:
            raise CheckpointError(
                f"{what}: record {r.filename!r} declares {r.file_size} bytes, more than the {size}-byte file "
                "holds; it was truncated or crafted. Do not load it."
            )


def check_file(path: str, weights_only: bool = True) -> None:
    """A checkpoint file: a regular file whose zip records fit in it (before torch.load allocates any)."""
    size = regular_file(path)
    with open(path, "rb") as f:
        check_zip(f, size, f"checkpoint {path!r}", required=weights_only)


def check_storage(metadata: Any, directory: str, what: str) -> None:
    """A DCP directory's declared tensor sizes are covered by chunks whose bytes lie in its regular files."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    sizes: dict[str, int] = {}
    lengths: dict[tuple[str, tuple[int, ...]], int] = {}
    for index, info in (metadata.storage_data or {}).items():
        name = str(info.relative_path)
        if name not in sizes:
            sizes[name] = regular_file(os.path.join(directory, name), "checkpoint data file", follow=False)
        if info.offset < 0 or info.length < 0 or info.offset + info.length > sizes[name]:
            raise CheckpointError(
                f"{what}: item {index.fqn!r} lies at bytes {info.offset}..{info.offset + info.length} of "
                f"{name!r}, which has {sizes[name]}; the directory was truncated or crafted. Do not load it."
            )
        lengths[(index.fqn, tuple(index.offset or ()))] = info.length
    for fqn, md in metadata.state_dict_metadata.items():
        if not isinstance(md, TensorStorageMetadata):
            continue
        item = md.properties.dtype.itemsize
        declared, covered = math.prod(md.size) * item, 0
        for chunk in md.chunks:
            need = math.prod(chunk.sizes) * item
            stored = lengths.get((fqn, tuple(chunk.offsets)), -1)
            if need > stored:
                raise CheckpointError(
                    f"{what}: tensor {fqn!r} declares a chunk of {need} bytes, but "
                    + ("no data for it" if stored < 0 else f"only {stored} bytes are stored for it")
                    + "; the directory was truncated or crafted. Do not load it."
                )
            covered += need
        if declared > covered:
            raise CheckpointError(
                f"{what}: tensor {fqn!r} declares {tuple(md.size)} ({declared} bytes) but its chunks hold "
                f"{covered}; the directory was truncated or crafted. Do not load it."
            )


# ----- contents -----------------------------------------------------------------------------------------
def check_contents(ckpt: Any, path: str, directory: bool = False) -> None:
    """The keys a restore reads have the kinds save() writes; else a CheckpointError naming what is wrong."""

    def bad(problem: str) -> CheckpointError:
        return CheckpointError(
            f"checkpoint {path!r} {problem}; it was not written by this Tandem's save_checkpoint."
        )

    if not isinstance(ckpt, dict):
        raise bad(f"holds a {type(ckpt).__name__}, not a checkpoint dict")
    version = ckpt.get("tandem_version")
    if version != FORMAT_VERSION:
        found = "has no 'tandem_version'" if version is None else f"has format version {version!r}"
        raise bad(f"{found}, and this Tandem reads version {FORMAT_VERSION}")
    if not directory:
        weights = ckpt.get("state_dict")
        if not isinstance(weights, dict):
            raise bad(f"has a {type(weights).__name__} as 'state_dict', not a dict of tensors")
        for k, v in weights.items():
            if not isinstance(k, str) or not isinstance(v, torch.Tensor):
                raise bad(f"has the weight {k!r} = {type(v).__name__}, not a tensor")
    for key in ("epoch", "global_step"):
        value = ckpt.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise bad(f"has {key!r} = {value!r}, not a whole number >= 0")
    loop = ckpt.get("loop", {})
    if not isinstance(loop, dict):
        raise bad(f"has a {type(loop).__name__} as 'loop', not a dict")
    if "ranks" not in loop:
        return  # weights only: nothing more is read
    _check_resumable(ckpt, loop, bad, directory)


def _check_resumable(ckpt: dict[str, Any], loop: dict[str, Any], bad: Any, directory: bool) -> None:
    """What resuming reads: the loop position, each rank's part, optimizer and scheduler states, callbacks."""
    if not isinstance(loop.get("batch_in_epoch"), int) or not isinstance(loop.get("epoch_finished"), bool):
        raise bad("has no loop position ('loop' needs batch_in_epoch and epoch_finished)")
    if not isinstance(loop["ranks"], list) or not all(isinstance(r, dict) for r in loop["ranks"]):
        raise bad("has 'loop.ranks' that is not a list of each rank's state")
    if directory:
        if not isinstance(ckpt.get("optimizers"), int):
            raise bad("is a full checkpoint without the number of its optimizer states ('optimizers')")
    else:
        states = ckpt.get("optimizer_states")
        if not isinstance(states, list) or not all(isinstance(s, dict) for s in states):
            raise bad("is a full checkpoint (it has each rank's loop state) without 'optimizer_states'")
    if not isinstance(ckpt.get("lr_schedulers"), list):
        raise bad("is a full checkpoint without its list of scheduler states ('lr_schedulers')")
    for key in ("callbacks", "strategy", "hyper_parameters"):
        if key in ckpt and not isinstance(ckpt[key], dict):
            raise bad(f"has a {type(ckpt[key]).__name__} as {key!r}, not a dict")


_REMEDY = "Load it into the model it was saved from, or start without ckpt_path."


def check_compatible(
    model: torch.nn.Module, state_dict: dict[str, Any], path: str, remedy: str = _REMEDY
) -> None:
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
        raise IncompatibleCheckpointError(
            f"checkpoint {path!r} was saved from a different model: " + "; ".join(parts) + ". " + remedy
        )


def _check_count(path: str, saved: int, optimizers: list[torch.optim.Optimizer]) -> None:
    if saved != len(optimizers):
        raise CheckpointError(
            f"checkpoint {path!r} has {saved} optimizer(s) but configure_optimizers returned {len(optimizers)}."
        )


def resumable(ckpt: dict[str, Any]) -> bool:
    """True for a full checkpoint (with optimizer and loop state), False for weights only."""
    return "ranks" in ckpt.get("loop", {})
