"""Crafted checkpoints of issue 24: files that declare more than they hold, and malformed contents.

Each starts from a genuine checkpoint and changes only what the attack needs, in plain data (no pickle
payloads here: tests/test_safe_load.py and tests/test_dcp_safety.py have those).
"""

from __future__ import annotations

import io
import os
import pickle
import zipfile

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, TensorStorageMetadata


def deflated_bomb(genuine: bytes, declared: int) -> bytes:
    """`genuine` (a torch.save zip) with its first storage record replaced by `declared` zero bytes, deflated:
    a small file whose record declares `declared` bytes (torch's reader allocates them before reading)."""
    zin = zipfile.ZipFile(io.BytesIO(genuine))
    out, replaced = io.BytesIO(), False
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as zout:
        for info in zin.infolist():
            if not replaced and "/data/" in info.filename and not info.filename.endswith(".pkl"):
                with zout.open(info.filename, "w", force_zip64=True) as w:  # streamed: never held whole
                    for _ in range(declared >> 24):
                        w.write(bytes(1 << 24))
                    w.write(bytes(declared & ((1 << 24) - 1)))
                replaced = True
                continue
            zout.writestr(info.filename, zin.read(info), compress_type=zipfile.ZIP_STORED)
    assert replaced, "no storage record to replace"
    return out.getvalue()


def tensor_bytes(t: torch.Tensor) -> bytes:
    buf = io.BytesIO()
    torch.save(t, buf)
    return buf.getvalue()


def declare_size(path: str, key: str, n: int) -> None:
    """Rewrite a DCP directory's .metadata so that tensor `key` declares n elements (one chunk at 0)."""
    md = dcp.FileSystemReader(path).read_metadata()
    old = md.state_dict_metadata[key]
    assert isinstance(old, TensorStorageMetadata)
    zeros = torch.Size([0] * len(old.size))
    size = torch.Size([n, *old.size[1:]])
    md.state_dict_metadata[key] = TensorStorageMetadata(
        old.properties, size, [ChunkStorageMetadata(zeros, size)]
    )
    with open(os.path.join(path, ".metadata"), "wb") as f:
        pickle.dump(md, f)


def point_item_at(path: str, key: str, blob: bytes) -> None:
    """Make tensor item `key` of a DCP directory read its bytes from a new data file holding `blob`."""
    md = dcp.FileSystemReader(path).read_metadata()
    with open(os.path.join(path, "crafted.distcp"), "wb") as f:
        f.write(blob)
    for index, info in md.storage_data.items():
        if index.fqn == key:
            info.relative_path, info.offset, info.length = "crafted.distcp", 0, len(blob)
    with open(os.path.join(path, ".metadata"), "wb") as f:
        pickle.dump(md, f)
