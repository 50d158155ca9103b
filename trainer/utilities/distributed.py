"""is_shared_filesystem: whether every process of the job sees the same files under a path (Lightning's)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any


def is_shared_filesystem(strategy: Any, path: str | Path | None = None, timeout: int = 3) -> bool:
    """True when the file rank 0 writes under `path` (default: the working directory) is seen by every process
    within `timeout` seconds; a remote URL ("s3://...") and a single process count as shared. Every rank
    must call it (it communicates)."""
    if path is not None and "://" in str(path) and not str(path).startswith("file://"):
        return True
    local = Path(Path.cwd() if path is None else path).resolve()
    comm = strategy.comm
    if comm.world_size == 1:
        return True
    if not all(comm.gather_object(comm.broadcast(str(local), 0) == str(local))):  # every rank decides alike
        return False
    if not all(comm.gather_object(local.exists())):
        raise FileNotFoundError(
            f"Unable to determine if the path belongs to a shared filesystem. The path does not exist: {local}"
        )
    folder = local.parent if local.is_file() else local
    check = folder / f".tandem_shared_fs_check_{comm.broadcast(uuid.uuid4().hex, 0)}"
    if comm.rank == 0:
        check.touch()
    comm.barrier("is_shared_filesystem")
    deadline, found = time.monotonic() + timeout, check.exists()
    while not found and time.monotonic() < deadline:
        time.sleep(0.1)
        found = check.exists()
    shared = all(comm.gather_object(found))
    comm.barrier("is_shared_filesystem done")
    if comm.rank == 0:
        check.unlink(missing_ok=True)
    return bool(comm.broadcast(shared, 0))
