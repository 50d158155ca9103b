"""One atomic write for every file Tandem produces (checkpoints, configs, hparams, CSV metrics), and the
check that a path given for them is a local one.

In the bottom layer (it imports only tandem_core.errors), so every package may use it.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Callable
from typing import BinaryIO

from tandem_core.errors import ConfigError

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")


def is_url(path: object) -> bool:
    """True for a URL such as ``s3://bucket/run`` or ``memory://x`` (Lightning's fsspec paths)."""
    return isinstance(path, str) and bool(_URL.match(path))


def refuse_url(path: object, what: str) -> None:
    """A ConfigError (a ValueError) naming `what` when `path` is a URL: Tandem writes its files atomically on a
    local or mounted file system (temporary file, fsync, rename), which object stores do not offer; it never
    turns ``s3://b/x`` into a local directory ``./s3:/b/x`` silently."""
    if is_url(path):
        raise ConfigError(
            f"{what} {path!r} is a URL: Tandem writes only to local file paths (or a mounted file system, e.g. "
            "an s3fs / gcsfuse mount point), since its writes are atomic renames; pass a local directory and copy "
            "the results to the object store afterwards."
        )


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
