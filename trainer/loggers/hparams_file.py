"""hparams.yaml read and written as plain YAML: Lightning's ``load_hparams_from_yaml`` / ``save_hparams_to_yaml``
(and its legacy ``meta_tags.csv``: ``load_hparams_from_tags_csv`` / ``save_hparams_to_tags_csv``).

Reading is ``yaml.safe_load``: a ``!!python/...`` tag in the file is refused (a YAML file can name any callable
to run), where Lightning's ``yaml.full_load`` builds some Python objects. A value YAML cannot hold as plain data
(a class, a module) is written as its text, with a warning naming it.
"""

from __future__ import annotations

import ast
import csv
import io
import os
import warnings
from argparse import Namespace
from collections.abc import Mapping
from typing import Any

from tandem_core.fileio import atomic_write
from trainer.loggers.base import yaml_safe


def load_hparams_from_yaml(config_yaml: str | os.PathLike[str], use_omegaconf: bool = True) -> Any:
    """The hyperparameters in `config_yaml` (an OmegaConf ``DictConfig`` when omegaconf is installed and
    `use_omegaconf`, else a dict); a missing file gives ``{}`` with a RuntimeWarning, as Lightning's.

    Example: ``load_hparams_from_yaml("lightning_logs/version_0/hparams.yaml")["lr"]``.
    """
    import yaml  # PyYAML comes with omegaconf

    path = os.fspath(config_yaml)
    if not os.path.exists(path):
        warnings.warn(f"no hyperparameters file at {path}; returning {{}}.", RuntimeWarning, stacklevel=2)
        return {}
    with open(path, encoding="utf-8") as f:
        hparams = yaml.safe_load(f)
    if use_omegaconf:
        try:
            from omegaconf import OmegaConf
            from omegaconf.errors import UnsupportedValueType, ValidationError
        except ImportError:
            return hparams
        try:
            return OmegaConf.create(hparams)
        except (UnsupportedValueType, ValidationError):
            return hparams
    return hparams


def save_hparams_to_yaml(
    config_yaml: str | os.PathLike[str], hparams: Mapping[str, Any] | Namespace, use_omegaconf: bool = True
) -> None:
    """Write `hparams` (a dict, Namespace, AttributeDict or OmegaConf config) to `config_yaml` as plain YAML.

    The folder must exist (a RuntimeError otherwise, as Lightning's). `use_omegaconf` (Lightning's): OmegaConf
    configs inside are resolved to plain containers either way. Example: ``save_hparams_to_yaml(p, {"lr": 0.1})``.
    """
    import yaml

    path = os.fspath(config_yaml)
    folder = os.path.dirname(path) or "."
    if not os.path.isdir(folder):
        raise RuntimeError(f"cannot write {path}: the folder {folder} does not exist.")
    if isinstance(hparams, Namespace):
        hparams = vars(hparams)
    if not isinstance(hparams, Mapping):
        try:
            from omegaconf import DictConfig, OmegaConf
        except ImportError:
            DictConfig = ()  # noqa: N806
        if not isinstance(hparams, DictConfig):
            raise TypeError(
                f"hparams must be a dict, Namespace or OmegaConf config, not {type(hparams).__name__}"
            )
        hparams = OmegaConf.to_container(hparams, resolve=True)
    plain = {str(k): _plain(v) for k, v in dict(hparams).items()}
    texts = [k for k, v in dict(hparams).items() if yaml_safe(plain[str(k)]) != plain[str(k)]]
    if texts:
        warnings.warn(
            f"hyperparameters {texts} are not plain data; hparams.yaml holds their text.", stacklevel=2
        )
    atomic_write(path, yaml.safe_dump(yaml_safe(plain), sort_keys=False))


def _plain(value: Any) -> Any:
    """OmegaConf containers resolved to dicts and lists; an Enum as its name (Lightning's)."""
    from enum import Enum

    if isinstance(value, Enum):
        return value.name
    try:
        from omegaconf import Container, OmegaConf

        if isinstance(value, Container):
            return OmegaConf.to_container(value, resolve=True)
    except ImportError:
        pass
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value


def save_hparams_to_tags_csv(
    tags_csv: str | os.PathLike[str], hparams: Mapping[str, Any] | Namespace
) -> None:
    """Write `hparams` as Lightning's legacy tags CSV: a ``key,value`` header, then one row per hyperparameter
    (each value as its ``str``). The folder must exist (a RuntimeError otherwise, as Lightning's)."""
    path = os.fspath(tags_csv)
    folder = os.path.dirname(path) or "."
    if not os.path.isdir(folder):
        raise RuntimeError(f"cannot write {path}: the folder {folder} does not exist.")
    if isinstance(hparams, Namespace):
        hparams = vars(hparams)
    out = io.StringIO(newline="")
    writer = csv.writer(out)
    writer.writerow(["key", "value"])
    writer.writerows([k, v] for k, v in hparams.items())
    atomic_write(path, out.getvalue())


def load_hparams_from_tags_csv(tags_csv: str | os.PathLike[str]) -> dict[str, Any]:
    """The hyperparameters of a tags CSV written by `save_hparams_to_tags_csv`; each value read as a Python
    literal where it is one (``ast.literal_eval``: numbers, strings, lists, ..., never a call), else kept as text.
    A missing file gives ``{}`` with a RuntimeWarning, as Lightning's."""
    path = os.fspath(tags_csv)
    if not os.path.exists(path):
        warnings.warn(f"no tags file at {path}; returning {{}}.", RuntimeWarning, stacklevel=2)
        return {}
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))[1:]
    return {row[0]: _literal(row[1]) for row in rows}


def _literal(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text


def load_hparams_file(path: str | os.PathLike[str]) -> Any:
    """`load_from_checkpoint(hparams_file=path)`: the hyperparameters of a ``.yaml``/``.yml`` file (safe YAML) or a
    tags ``.csv``; any other extension is a ValueError, as in Lightning."""
    extension = os.fspath(path).rsplit(".", 1)[-1].lower()
    if extension == "csv":
        return load_hparams_from_tags_csv(path)
    if extension in ("yml", "yaml"):
        return load_hparams_from_yaml(path, use_omegaconf=False) or {}
    raise ValueError(f".csv, .yml or .yaml is required for `hparams_file`, not {os.fspath(path)!r}")
