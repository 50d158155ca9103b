"""One atomic write for every file Tandem produces (checkpoints, configs, hparams, CSV metrics), and the
check that a path given for them is a local one.

In the bottom layer (it imports only tandem_core.errors), so every package may use it.
"""

from __future__ import annotations

import os
import re
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import Future, wait
from typing import Any, BinaryIO

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


# ----- writes still in flight in this process (AsyncCheckpointIO): readers wait for them ---------------------
_PENDING: dict[str, Future[Any]] = {}
_PENDING_LOCK = threading.Lock()


def writing(path: str | os.PathLike[str], done: Future[Any]) -> None:
    """Record that `path` is being written in the background until `done` completes (success or not):
    `wait_written(path)` blocks until then."""
    key = os.path.abspath(os.fspath(path))
    with _PENDING_LOCK:
        _PENDING[key] = done

    def forget(_: Future[Any]) -> None:
        with _PENDING_LOCK:
            if _PENDING.get(key) is done:
                del _PENDING[key]

    done.add_done_callback(forget)


def wait_written(path: str | os.PathLike[str]) -> None:
    """Block until no background write of `path` started in this process is in flight, so that a reader
    (a load, an upload, a link) sees the whole file; its error, if any, is the writer's to report."""
    with _PENDING_LOCK:
        done = _PENDING.get(os.path.abspath(os.fspath(path)))
    if done is not None:
        wait([done])


def remove_stale_temps(path: str | os.PathLike[str]) -> None:
    """Delete the temporary files `atomic_write` leaves beside `path` when its process is killed mid-write
    (``.tmp-<name>-*``); only this name's, never another file's."""
    path = os.fspath(path)
    directory, name = os.path.dirname(os.path.abspath(path)), os.path.basename(path)
    try:
        entries = os.listdir(directory)
    except OSError:
        return
    for entry in entries:
        if entry.startswith(f".tmp-{name}-"):
            try:
                os.unlink(os.path.join(directory, entry))
            except OSError:
                pass
