"""Checkpoint file names: the filename template, version suffixes, and finding the newest last.ckpt
of one experiment."""

from __future__ import annotations

import os
import re

from trainer.errors import ConfigError

_FIELD = re.compile(r"\{([^{}:]+)(?::([^{}]*))?\}")
_LAST = re.compile(r"last(-v\d+)?\.ckpt")
_VERSION = re.compile(r"version_\d+")


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


def last_files(directory: str) -> list[tuple[float, str]]:
    """(mtime, path) of each last.ckpt / last-vN.ckpt directly in `directory` (one level, no recursion).

    A file deleted while the directory is listed (a run cleaning up beside this one) is skipped.
    """
    found: list[tuple[float, str]] = []
    try:
        with os.scandir(directory) as entries:
            for e in entries:
                if not _LAST.fullmatch(e.name):
                    continue
                try:
                    if e.is_file():
                        found.append((e.stat().st_mtime, e.path))
                except OSError:  # vanished, or a broken / looping link
                    continue
    except OSError:  # no such directory (yet), not a directory, not readable
        return []
    return found


def version_checkpoint_dirs(root: str) -> list[str]:
    """root/version_N/checkpoints for every version_N directly in `root`: one experiment's own runs.

    Listed with os.scandir one level deep; a version_N that is a symlink is not followed.
    """
    dirs: list[str] = []
    try:
        with os.scandir(root) as entries:
            for e in entries:
                try:
                    if _VERSION.fullmatch(e.name) and e.is_dir(follow_symlinks=False):
                        dirs.append(os.path.join(e.path, "checkpoints"))
                except OSError:
                    continue
    except OSError:
        return []
    return dirs


def newest_last(dirs: list[str]) -> str | None:
    """The newest last.ckpt / last-vN.ckpt directly inside any of `dirs`, or None."""
    found = newest_lasts(dirs)
    return found[0] if found else None


def newest_lasts(dirs: list[str]) -> list[str]:
    """Every last.ckpt / last-vN.ckpt directly inside any of `dirs`, newest first."""
    return [path for _, path in sorted((f for d in dirs for f in last_files(d)), reverse=True)]
