"""Checkpoint file names: the filename template, version suffixes, and finding the newest last.ckpt."""

from __future__ import annotations

import glob
import os
import re

from trainer.errors import ConfigError

_FIELD = re.compile(r"\{([^{}:]+)(?::([^{}]*))?\}")
_LAST = re.compile(r"last(-v\d+)?\.ckpt")


def parse_template(filename: str | None) -> list[tuple[str, str]]:
    """The (key, format spec) fields of a template such as ``"{epoch}-{val/loss:.3f}"``; checks each spec."""
    fields = [(m.group(1).strip(), m.group(2) or "") for m in _FIELD.finditer(filename or "")]
    for name, spec in fields:
        try:
            format(0 if name in ("epoch", "step") else 0.0, spec)  # epoch and step are ints ("{epoch:02d}")
        except ValueError as e:
            raise ConfigError(
                f"ModelCheckpoint(filename={filename!r}): bad format {spec!r} for {name!r}: {e}"
            ) from e
    return fields


def format_name(template: str, values: dict[str, float], equals: str | None) -> str:
    """Fill `template` with `values`; with `equals` each field reads ``key<equals>value``; '/' becomes '_'.

    Example: ``format_name("{epoch}-{val/loss:.2f}", {"epoch": 3, "val/loss": 0.5}, "=")`` gives
    ``"epoch=3-val_loss=0.50"``.
    """

    def fill(m: re.Match[str]) -> str:
        name, spec = m.group(1).strip(), m.group(2) or ""
        value = values[name]
        if name in ("epoch", "step"):
            value = int(value)
        text = format(value, spec)
        return text if equals is None else f"{name.replace('/', '_')}{equals}{text}"

    return _FIELD.sub(fill, template).replace("/", "_")


def unique_path(path: str, replaceable: str) -> str:
    """`path`, or with -v1, -v2, ... appended when a file other than `replaceable` is already there."""
    stem, ext = os.path.splitext(path)
    candidate, n = path, 1
    while os.path.exists(candidate) and candidate != replaceable:
        candidate, n = f"{stem}-v{n}{ext}", n + 1
    return candidate


def newest_last(roots: list[str]) -> str | None:
    """The newest last.ckpt / last-vN.ckpt in the first of `roots` (glob patterns allowed) that has one."""
    for root in roots:
        found = [
            p for p in glob.glob(os.path.join(root, "last*.ckpt")) if _LAST.fullmatch(os.path.basename(p))
        ]
        if found:
            return max(found, key=os.path.getmtime)
    return None
