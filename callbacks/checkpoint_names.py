"""Checkpoint file names: the filename template, version suffixes, and finding the newest last.ckpt
of one experiment."""

from __future__ import annotations

import os
import re
import warnings
from typing import Any

from tandem_core.errors import ConfigError

_FIELD = re.compile(r"\{([^{}:]+)(?::([^{}]*))?\}")
_LAST = re.compile(r"(last(?:-v\d+)?\.ckpt)(\.old-[0-9a-f]{12})?")
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


def template_values(
    cb: Any, trainer: Any, candidates: dict[str, Any], names: list[str]
) -> dict[str, float] | None:
    """The floats of `names` for ModelCheckpoint `cb`'s save (rank 0's on every rank), or None to skip it.

    A missing monitor skips the save until validation has run (callbacks/monitor.py). A filename key not
    logged yet is Lightning's rule: filled with 0 and saved (said once, so a short run still ends with its
    checkpoint); a key that cannot appear any more (validation has run, or there is none) is a typo and a
    ConfigError naming the logged keys, where Lightning would name every file "...=0"."""
    from callbacks.monitor import no_validation, rank_zero_decides

    missing = [n for n in names if n not in candidates]
    if cb.monitor in missing:
        cb._monitor.missing(trainer, cb._monitor.missing_message(trainer), strict=True, action="save")
        return None
    if missing:
        message = (
            f"ModelCheckpoint(filename={cb.filename!r}) uses {missing}, which were never logged; logged "
            f"keys: {sorted(trainer.callback_metrics)}. Log them with self.log or change the template."
        )
        if cb._monitor.validated or no_validation(trainer):
            raise ConfigError(message)
        if message not in cb._monitor._warned and trainer.is_global_zero:
            warnings.warn(message + " Not logged yet: 0 in this file's name, as Lightning.", stacklevel=4)
        cb._monitor._warned.add(message)
    return rank_zero_decides(trainer, {n: float(candidates[n]) if n in candidates else 0 for n in names})


def unique_path(path: str, replaceable: str) -> str:
    """`path`, or with -v1, -v2, ... appended when a file other than `replaceable` is already there."""
    stem, ext = os.path.splitext(path)
    candidate, n = path, 1
    while os.path.exists(candidate) and candidate != replaceable:
        candidate, n = f"{stem}-v{n}{ext}", n + 1
    return candidate


def last_files(directory: str) -> list[tuple[float, str]]:
    """(mtime, path) of each last.ckpt / last-vN.ckpt directly in `directory` (one level, no recursion), in
    every form Tandem writes: a file (or save_last="link"'s link to one), a sharded directory (FSDP), a link
    to a sharded directory beside it (save_last="link" under FSDP; a directory link elsewhere is not
    followed), and a sharded directory a crash left moved aside as ``last.ckpt.old-*`` (the save that
    replaces a directory renames the old one aside first; strategies/checkpoint/io.py reads it from there).

    An entry deleted while the directory is listed (a run cleaning up beside this one) is skipped.
    """
    own: dict[str, tuple[float, str]] = {}  # by name: last.ckpt, last-v1.ckpt, ...
    aside: dict[str, tuple[float, str]] = {}  # the newest copy moved aside, by the name it stands for
    try:
        with os.scandir(directory) as entries:
            for e in entries:
                m = _LAST.fullmatch(e.name)
                try:
                    if m is None or not _is_checkpoint(e, moved_aside=m.group(2) is not None):
                        continue
                    entry = (e.stat().st_mtime, e.path)
                except OSError:  # vanished, or a broken / looping link
                    continue
                if m.group(2) is None:
                    own[m.group(1)] = entry
                else:
                    aside[m.group(1)] = max(aside.get(m.group(1), entry), entry)
    except OSError:  # no such directory (yet), not a directory, not readable
        return []
    moved = [v for k, v in aside.items() if not os.path.lexists(os.path.join(directory, k))]
    return [*own.values(), *moved]


def _is_checkpoint(e: os.DirEntry[str], moved_aside: bool) -> bool:
    """A checkpoint file (through a link), or a directory that is one: a real directory, or a link to a
    directory in the same place (what save_last="link" makes). Raises OSError for a vanished entry."""
    if moved_aside:  # what a save renamed aside itself: never a link
        return e.is_dir(follow_symlinks=False) or e.is_file(follow_symlinks=False)
    if e.is_file():
        return True
    if not e.is_dir():
        return False
    if not e.is_symlink():
        return True
    parent = os.path.realpath(os.path.dirname(e.path))
    return os.path.dirname(os.path.realpath(e.path)) == parent


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
