"""One atomic write for every file Tandem produces (checkpoints, configs, hparams, CSV metrics).

A leaf module: it imports nothing of ours, so every package may use it.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import BinaryIO


def atomic_write(path: str | os.PathLike[str], data: bytes | str | Callable[[BinaryIO], None]) -> None:
    """Write `data` to `path` so that a crash at any moment leaves either the old file or the new one.

    `data` is bytes, text (UTF-8) or a function that writes to a binary file object. The bytes go to a
    uniquely named temporary file in the same directory, are fsynced, renamed over `path`, and the
    directory is fsynced so that the rename itself is durable. Example::

        atomic_write("run/config.yaml", yaml_text)
        atomic_write("run/last.ckpt", lambda f: torch.save(state, f))
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".tmp-{os.path.basename(path)}-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            if callable(data):
                data(f)
            else:
                f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
