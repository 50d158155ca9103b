"""`view`: a read-only property that reads an attribute path (Lightning's many names for one value)."""

from __future__ import annotations

import functools
from typing import Any


def view(path: str, doc: str = "") -> Any:
    """A property returning ``self.<path>``: ``current_epoch = view("state.epoch")``."""
    names = path.split(".")

    def get(self: Any) -> Any:
        return functools.reduce(getattr, names, self)

    return property(get, doc=doc or f"The same as ``{path}`` (read-only).")
