"""Loading a run config: YAML files (or dicts) merged in order, ``key=value`` overrides on top, then
omegaconf's interpolation, then the schema (trainer/config/schema.py). Example::

    cfg = resolve(["base.yaml", "ddp.yaml"], ["trainer.max_epochs=3"])  # a plain, validated dict
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from tandem_core.errors import ConfigError, TandemError
from trainer.config import lightning_form
from trainer.config.schema import SECTIONS, validate

Source = str | os.PathLike | Mapping[str, Any] | DictConfig


def load(sources: Source | Sequence[Source] | None = None, overrides: Sequence[str] = ()) -> DictConfig:
    """Merge config files (or dicts) in order, then apply ``key=value`` overrides: the last one wins."""
    if sources is None:
        sources = []
    elif isinstance(sources, (str, os.PathLike, Mapping, DictConfig)):
        sources = [sources]
    cfg = OmegaConf.create()
    for src in sources:
        try:
            cfg = OmegaConf.merge(cfg, _lightning_form(_read(src)))
        except TandemError:
            raise
        except Exception as e:
            raise ConfigError(f"cannot merge config {src!r}: {_brief(e)}") from e
    for item in overrides:
        if not isinstance(item, str) or "=" not in item or not item.split("=", 1)[0].strip():
            raise ConfigError(f"override {item!r} is not key=value (for example trainer.max_epochs=3)")
        try:
            change = lightning_form.override(item)
            if isinstance(change, str):
                cfg.merge_with_dotlist([change])
            else:  # a whole entry (model=my.Net, optimizer={class_path: ...}): merged onto what is there
                OmegaConf.update(cfg, change[0], change[1], merge=True)
        except TandemError:
            raise
        except Exception as e:  # omegaconf's grammar and YAML's parser both reject text here
            raise ConfigError(f"cannot apply override {item!r}: {_brief(e)}") from e
    return cfg


def resolve(source: Source | Sequence[Source] | None = None, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Load, interpolate and validate: a plain dict with every section and every Trainer option."""
    cfg = source if isinstance(source, DictConfig) and not overrides else load(source, overrides)
    try:
        data = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except MissingMandatoryValue as e:
        raise ConfigError(
            f"{e.full_key} is required (it is ??? in the config): set it, e.g. {e.full_key}=..."
        ) from e
    except Exception as e:
        raise ConfigError(f"cannot resolve the config: {_brief(e)}") from e
    return validate(data)


def _lightning_form(cfg: DictConfig) -> DictConfig:
    """A file in LightningCLI's form (model, class_path, init_args, ...) in Tandem's sections; interpolations
    are kept as written (they refer to Tandem's names: ${task.lr}, not ${model.init_args.lr})."""
    data = OmegaConf.to_container(cfg, resolve=False)
    if not isinstance(data, dict) or not lightning_form.needed(data):
        return cfg
    return OmegaConf.create(lightning_form.translate(data))


def _read(src: Source) -> DictConfig:
    if isinstance(src, DictConfig):
        return src
    if isinstance(src, Mapping):
        try:
            return OmegaConf.create(dict(src))
        except Exception as e:
            raise ConfigError(
                f"a config holds only YAML values (mappings, lists, numbers, strings): {_brief(e)}"
            ) from e
    path = os.fspath(src)
    if not os.path.isfile(path):
        raise ConfigError(f"config file {path!r} does not exist")
    try:
        cfg = OmegaConf.load(path)
    except Exception as e:
        raise ConfigError(f"config file {path!r} is not valid YAML: {_brief(e)}") from e
    if not isinstance(cfg, DictConfig):
        raise ConfigError(f"config file {path!r} must hold a mapping of sections ({', '.join(SECTIONS)})")
    return cfg


def _brief(e: BaseException) -> str:
    """An omegaconf/YAML message on one line, with the key it concerns."""
    skip = ("full_key:", "object_type", "reference_type", 'in "<unicode string>"')
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip() and not ln.strip().startswith(skip)]
    text = "; ".join(lines)[:300] or type(e).__name__
    key = getattr(e, "full_key", None)
    return f"{text} (at {key})" if key else text
