"""Reading a directory checkpoint's DCP files without running code from them.

torch.distributed.checkpoint reads a directory's ``.metadata`` with a plain ``pickle.load`` and every
non-tensor item (an optimizer's param_groups) with ``torch.load(weights_only=False)``, so a crafted directory
would run code as it loads. Here the metadata is unpickled allowing only the classes DCP metadata is made of
(`ALLOWED`), and non-tensor items are read with ``weights_only=True``. `read_metadata` and `load` are the
only ways Tandem reads DCP data.
"""

from __future__ import annotations

import io
import os
import pickle
from pathlib import PurePath
from typing import IO, Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem

from strategies.checkpoint.checks import check_storage, check_zip, regular_file
from strategies.checkpoint.files import refused_global, unsafe
from tandem_core.errors import CheckpointError

_MD = "torch.distributed.checkpoint.metadata"
# Every global a .metadata written by torch's DCP pickles (found by unpickling real ones: FSDP runs with SGD
# and Adam, and a dcp.save of tensors of several dtypes and memory formats next to nested non-tensor values),
# plus torch's dtypes (checked in `_allowed`). Each builds data; none runs anything given to it.
ALLOWED = frozenset(
    {
        (_MD, "Metadata"),
        (_MD, "MetadataIndex"),
        (_MD, "TensorStorageMetadata"),
        (_MD, "BytesStorageMetadata"),
        (_MD, "ChunkStorageMetadata"),
        (_MD, "TensorProperties"),
        (_MD, "StorageMeta"),
        (_MD, "_MEM_FORMAT_ENCODING"),  # an Enum: a tensor's memory format
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        ("torch", "Size"),
        ("torch.serialization", "_get_layout"),  # how torch.layout pickles: a lookup by name
        ("pathlib", "PosixPath"),  # StorageMeta.checkpoint_id
        ("pathlib", "WindowsPath"),
    }
)


def _allowed(module: str, name: str) -> bool:
    if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
        return True
    return (module, name) in ALLOWED


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP metadata; any global outside `ALLOWED` (and torch's dtypes) is a CheckpointError."""

    def __init__(self, file: IO[bytes], path: str) -> None:
        super().__init__(file)
        self.path = path

    def find_class(self, module: str, name: str) -> Any:
        if not _allowed(module, name):
            raise unsafe(
                f"checkpoint metadata {self.path!r}",
                f"{module}.{name}",
                "A DCP .metadata file holds only the checkpoint's index (names, shapes, dtypes, file offsets); "
                "this one holds more than torch.distributed.checkpoint writes there. Do not load it.",
            )
        return super().find_class(module, name)


class SafeReader(dcp.FileSystemReader):
    """A FileSystemReader whose metadata may hold only the plain data DCP writes there."""

    refused: CheckpointError | None = None  # kept because dcp.load reports a failed read_metadata vaguely

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        try:
            return self._read_metadata(os.fspath(self._get_metadata_path(kwargs.get("rank"))))
        except CheckpointError as e:
            self.refused = self.refused or e
            raise

    def _read_metadata(self, path: str) -> Metadata:
        if os.path.lexists(path):  # (a missing one is DCP's to report: it looks for per-rank metadata too)
            regular_file(path, "checkpoint metadata", follow=False)  # a named pipe would block the open
        with self.fs.create_stream(path, "rb") as f:
            metadata = _MetadataUnpickler(f, path).load()
        if not isinstance(metadata, Metadata):
            raise CheckpointError(f"{path!r} is not DCP metadata (it holds a {type(metadata).__name__}).")
        _check_inside(metadata, path)
        check_storage(metadata, os.path.dirname(path), f"checkpoint metadata {path!r}")
        if metadata.storage_meta is None:  # written by an older torch
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def _slice_file(self, file: Any, sinfo: Any) -> Any:
        """An item's bytes, checked first: each is a torch.save zip whose records must fit in it."""
        where = (
            f"item at bytes {sinfo.offset}.. of {os.path.join(str(self.path), str(sinfo.relative_path))!r}"
        )
        file.seek(sinfo.offset)
        check_zip(file, sinfo.length, f"checkpoint {where}")
        return super()._slice_file(file, sinfo)


def _check_inside(metadata: Metadata, path: str) -> None:
    """Every data file the metadata names lies inside the checkpoint directory."""
    for info in (metadata.storage_data or {}).values():
        where = PurePath(str(getattr(info, "relative_path", "")))
        if where.is_absolute() or ".." in where.parts:
            raise CheckpointError(
                f"{path!r} names the data file {str(where)!r}, outside its checkpoint directory; "
                "DCP never writes that, so this directory was tampered with. Do not load it."
            )


class SafePlanner(DefaultLoadPlanner):
    """DCP's default load planner, reading non-tensor items with torch.load(weights_only=True)."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        fqn = read_item.dest_index.fqn
        try:
            obj = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as e:
            what = f"item {fqn!r} of checkpoint {os.path.join(self.path, self._file(read_item))!r}"
            name = refused_global(e)
            if name is None:
                raise CheckpointError(f"{what} is not plain data torch.load can read ({e}).") from e
            raise unsafe(
                what,
                name,
                "If you trust this checkpoint, allow that global first with "
                f"torch.serialization.add_safe_globals([{name}]).",
            ) from e
        if self.flatten_state_dict:
            # the item goes back to its place in the nested state dict the caller passed
            set_element(self.original_state_dict, self.mappings[fqn], obj)
        else:
            self.state_dict[fqn] = obj

    def _file(self, read_item: ReadItem) -> str:
        info = self.metadata.storage_data.get(read_item.storage_index) if self.metadata else None
        return str(getattr(info, "relative_path", ""))


def read_metadata(path: str) -> Metadata:
    """The DCP metadata of the directory checkpoint `path`."""
    return SafeReader(path).read_metadata()


def load(state: dict[str, Any], path: str, no_dist: bool) -> None:
    """dcp.load of `path` into `state` (in place), through `SafeReader` and `SafePlanner`."""
    reader = SafeReader(path)
    try:
        dcp.load(state, checkpoint_id=path, storage_reader=reader, planner=SafePlanner(path), no_dist=no_dist)
    except CheckpointException as e:
        # DCP wraps what failed on any rank (in a BaseException); a refusal by the reader or the planner is
        # shown as it is, anything else as a CheckpointError naming the first failure
        failed = [exc for exc, _ in e.failures.values()]
        ours = [exc for exc in failed if isinstance(exc, CheckpointError)]
        if reader.refused is not None or ours:
            raise (reader.refused or ours[0]) from e
        first = f"{type(failed[0]).__name__}: {failed[0]}" if failed else str(e)
        raise CheckpointError(f"checkpoint directory {path!r} could not be read ({first}).") from e
