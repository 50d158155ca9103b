"""A checkpoint given by an http(s) URL (Lightning's `ckpt_path` / `load_from_checkpoint` take one): downloaded
into torch hub's cache directory (``$TORCH_HOME/hub/checkpoints``) under a name of the URL's hash, then read as a
local file, with the same checks (plain data unless trusted). A fresh download each time: a file of the same
name served later is never mistaken for an earlier one."""

from __future__ import annotations

import hashlib
import os
import urllib.parse

from tandem_core.errors import CheckpointNotFoundError


def is_http(path: object) -> bool:
    return isinstance(path, str) and path.lower().startswith(("http://", "https://"))


def fetch(url: str) -> str:
    """The local path of `url`'s content, downloaded now (a CheckpointNotFoundError when it cannot be)."""
    import torch.hub

    name = os.path.basename(urllib.parse.urlparse(url).path) or "checkpoint"
    folder = os.path.join(torch.hub.get_dir(), "checkpoints")
    os.makedirs(folder, exist_ok=True)
    local = os.path.join(folder, f"{hashlib.sha256(url.encode()).hexdigest()[:16]}-{name}")
    try:
        torch.hub.download_url_to_file(url, local, progress=False)  # to a temporary name, then renamed
    except Exception as e:  # noqa: BLE001 (HTTP errors, refused connections: the file is not there)
        raise CheckpointNotFoundError(
            f"checkpoint {url!r} could not be downloaded ({type(e).__name__}: {e})."
        ) from e
    return local
