"""LightningCLI's config form, read as Tandem's sections: ``model`` is the ``task``, ``class_path`` and
``init_args`` are ``_target_`` and the arguments, ``trainer.callbacks`` and ``trainer.logger`` entries go to
the ``callbacks`` and ``logger`` sections. Example::

    translate({"model": {"class_path": "my.Net", "init_args": {"lr": 0.1}}})  # {"task": {"_target_": "my.Net", "lr": 0.1}}
    override("model.lr=0.1")                                                   # "task.lr=0.1"

Only names are rewritten here: what a class path may build is checked afterwards, as for any ``_target_``
(trainer/config/types.py). Lightning's own callback, logger and strategy paths
(``lightning.pytorch.callbacks.ModelCheckpoint``) name Tandem's classes of the same name, and a bare class
name (LightningCLI's shorthand: ``class_path: ModelCheckpoint``, ``optimizer: Adam``) is looked up where its
section's classes live (`SHORTHAND`).
"""

from __future__ import annotations

import importlib
from typing import Any

from omegaconf import OmegaConf

from tandem_core.errors import ConfigError, did_you_mean

CLASS_PATH, INIT_ARGS, DICT_KWARGS = "class_path", "init_args", "dict_kwargs"
TARGET = "_target_"
# LightningCLI's top-level keys that Tandem's own form does not have (the rest keep their names).
LIGHTNING_KEYS = ("model", "optimizer", "lr_scheduler", "ckpt_path")
PLATEAU = "trainer.config.optim.ReduceLROnPlateau"  # Lightning's ReduceLROnPlateau: torch's with `monitor`
# Where a bare class name is looked up, per section (LightningCLI finds it among the subclasses it knows).
SHORTHAND = {
    "callbacks": ("callbacks",),
    "logger": ("trainer.loggers",),
    "trainer.strategy": ("strategies",),
    "optimizer": ("torch.optim",),
    "lr_scheduler": ("trainer.config.optim", "torch.optim.lr_scheduler"),
}
# Lightning's packages, and the Tandem package that has the class of the same name.
_PACKAGES = {
    "callbacks": "callbacks",
    "loggers": "trainer.loggers",
    "strategies": "strategies",
    "plugins": "trainer.plugins",
}
_LIGHTNING = ("lightning.pytorch", "pytorch_lightning")


def needed(data: dict[str, Any]) -> bool:
    """Is `data` (one file's plain dict) in LightningCLI's form, wholly or in part?"""
    trainer = data.get("trainer")
    nested = isinstance(trainer, dict) and (
        trainer.get("callbacks") is not None or isinstance(trainer.get("logger"), (dict, list))
    )
    return any(k in data for k in LIGHTNING_KEYS) or nested or _has_class_path(data)


def translate(data: dict[str, Any]) -> dict[str, Any]:
    """One config file (or dict) in LightningCLI's form -> the same config in Tandem's sections."""
    out = {k: v for k, v in data.items() if k not in ("model", "trainer")}
    if "model" in data:
        if "task" in data:
            raise ConfigError("the config has both 'model' (LightningCLI's name) and 'task'; keep one")
        out["task"] = entry(data["model"], "model")
    for name in ("data", "optimizer", "lr_scheduler"):
        if name in data:
            out[name] = entry(data[name], name)
    if "trainer" in data:
        out["trainer"] = _trainer(data["trainer"], out)
    return {k: node(v, k) if k in ("callbacks", "logger") else v for k, v in out.items()}


def _trainer(section: Any, out: dict[str, Any]) -> Any:
    if not isinstance(section, dict):
        return section
    section = dict(section)
    callbacks = section.pop("callbacks", None)
    if callbacks is not None:
        if out.get("callbacks") is not None:
            raise ConfigError("callbacks are listed both in trainer.callbacks and in 'callbacks'; keep one")
        items = callbacks if isinstance(callbacks, list) else [callbacks]
        out["callbacks"] = [entry(c, f"trainer.callbacks[{i}]", "callbacks") for i, c in enumerate(items)]
    if section.get("logger") == []:  # Lightning's Trainer(logger=[]): no loggers
        section["logger"] = False
    if isinstance(section.get("logger"), (dict, list)):
        loggers = section.pop("logger")
        if out.get("logger") is not None:
            raise ConfigError("loggers are given both in trainer.logger and in 'logger'; keep one")
        items = loggers if isinstance(loggers, list) else [loggers]
        out["logger"] = [entry(c, f"trainer.logger[{i}]", "logger") for i, c in enumerate(items)]
    if isinstance(section.get("strategy"), dict):
        section["strategy"] = entry(section["strategy"], "trainer.strategy", "trainer.strategy")
    return {k: node(v, f"trainer.{k}") for k, v in section.items()}


def entry(value: Any, where: str, kind: str | None = None) -> Any:
    """A section or argument that names a class: ``Name``, ``{class_path, init_args, dict_kwargs}``, or
    (to be merged onto an earlier file's) just arguments, under ``init_args`` or not."""
    kind = kind or where
    if isinstance(value, str):
        return {TARGET: class_name(value, where, kind)}
    if not isinstance(value, dict):
        return node(value, where)
    if CLASS_PATH not in value and INIT_ARGS not in value and DICT_KWARGS not in value:
        return {k: node(v, f"{where}.{k}") for k, v in value.items()}  # Tandem's form, or arguments only
    if TARGET in value:
        raise ConfigError(f"{where}: has both _target_ and class_path; keep one")
    extra = [k for k in value if k not in (CLASS_PATH, INIT_ARGS, DICT_KWARGS)]
    if extra and CLASS_PATH in value:
        raise ConfigError(
            f"{where}: {extra[0]!r} is next to class_path; LightningCLI's form puts a class's arguments "
            f"under init_args: move it to {where}.init_args.{extra[0]}"
        )
    out: dict[str, Any] = {}
    if CLASS_PATH in value:
        out[TARGET] = class_name(value[CLASS_PATH], f"{where}.class_path", kind)
    for key in (INIT_ARGS, DICT_KWARGS):
        args = value.get(key)
        if args is None:
            continue
        if not isinstance(args, dict):
            raise ConfigError(f"{where}.{key}: expected a mapping of argument names to values, got {args!r}")
        out.update({k: node(v, f"{where}.{key}.{k}") for k, v in args.items()})
    # without class_path, arguments may also stand at the top: merged onto an earlier file's class
    out.update({k: node(value[k], f"{where}.{k}") for k in extra})
    return out


def node(value: Any, where: str) -> Any:
    """An argument's value: its ``class_path`` entries (at any depth) in ``_target_`` form."""
    if isinstance(value, dict):
        if CLASS_PATH in value:
            return entry(value, where)
        return {k: node(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, list):
        return [node(v, f"{where}[{i}]") for i, v in enumerate(value)]
    return value


def class_name(path: Any, where: str, kind: str) -> str:
    """The Tandem import path for a LightningCLI class path: Lightning's own classes map to Tandem's of the
    same name, a bare name is looked up in `SHORTHAND`'s modules for `kind`; other paths stay as given."""
    if not isinstance(path, str) or not path:
        raise ConfigError(
            f"{where}: a class path is an import path such as my_project.models.Net, got {path!r}"
        )
    if path.startswith(tuple(f"{p}." for p in _LIGHTNING)):
        return _lightning_class(path, where)
    if "." in path or ":" in path:
        return path
    modules = SHORTHAND.get(kind.split("[")[0], ())
    names: list[str] = []
    for module_name in modules:
        module = importlib.import_module(module_name)
        if isinstance(getattr(module, path, None), type):
            return PLATEAU if path == "ReduceLROnPlateau" else f"{module_name}.{path}"
        names += [n for n in dir(module) if isinstance(getattr(module, n), type)]
    if modules:
        raise ConfigError(
            f"{where}: {' and '.join(modules)} has no class {path!r}{did_you_mean(path, names)} (a bare class "
            f"name is looked up there); or give the import path of your own class (my_project.module.{path})"
        )
    raise ConfigError(
        f"{where}: {path!r} is a bare class name; give its import path (my_project.models.{path}). LightningCLI "
        "finds the classes its script imported; Tandem looks bare names up for callbacks, loggers, strategies, "
        "optimizers and schedulers only"
    )


def tandem_name(path: Any) -> str | None:
    """Tandem's import path for one of Lightning's class paths that Tandem has a class for (its callbacks,
    loggers, strategies, ``cli.ReduceLROnPlateau``), or None (not Lightning's, or not one Tandem has)."""
    if not isinstance(path, str) or not path.startswith(tuple(f"{p}." for p in _LIGHTNING)):
        return None
    try:
        return _lightning_class(path, "")
    except ConfigError:
        return None


def _lightning_class(path: str, where: str) -> str:
    parts = path.split(".")
    rest = parts[2:] if parts[0] == "lightning" else parts[1:]
    name = parts[-1]
    if rest[:1] == ["cli"] and name == "ReduceLROnPlateau":
        return PLATEAU
    package = _PACKAGES.get(rest[0]) if len(rest) > 1 else None
    if package is None or not hasattr(importlib.import_module(package), name):
        raise ConfigError(
            f"{where}: {path!r} is Lightning's; Tandem has "
            + (
                f"no {name} in {package}"
                if package
                else "only Lightning's callbacks, loggers, strategies and plugins"
            )
            + ": name a Tandem class or your own (docs/configuration.md, 'LightningCLI configs')"
        )
    return f"{package}.{name}"


def override(item: str) -> str | tuple[str, Any]:
    """A ``key=value`` override in LightningCLI's names -> one in Tandem's (a ``(key, value)`` pair to merge
    where the value is a whole entry). ``model.lr=0.1`` -> ``task.lr=0.1``; ``optimizer=Adam`` -> ``optimizer._target_=...``;
    ``trainer.callbacks.0.init_args.patience=3`` -> ``callbacks.0.patience=3``; others unchanged."""
    key, sep, text = item.partition("=")
    parts = key.strip().split(".")
    head = parts[0]
    if head == "trainer" and len(parts) > 1 and parts[1] in ("callbacks", "logger"):
        if len(parts) == 2 and parts[1] == "logger":
            value = _parse(text)
            if value == []:
                return "trainer.logger=false"  # Lightning's Trainer(logger=[]): no loggers
            if not isinstance(value, (str, dict, list)):
                return item  # trainer.logger=false stays a Trainer option (and 3 is its error)
        parts = parts[1:] if len(parts) == 2 or parts[2].isdigit() else [parts[1], "0", *parts[2:]]
        head = parts[0]
    elif head == "model":
        parts = ["task", *parts[1:]]
    elif head not in ("data", "optimizer", "lr_scheduler"):
        return _nested(key.strip(), sep, text)
    section = head if head != "model" else "task"
    if len(parts) == 1 or (len(parts) == 2 and parts[1].isdigit()):  # a whole entry: a name or a mapping
        value = _parse(text)
        kind = "model" if key.startswith("model") else section
        if len(parts) == 1 and section in ("callbacks", "logger"):  # the whole list
            items = value if isinstance(value, list) else [value]
            return section, [entry(v, f"{key}[{i}]", section) for i, v in enumerate(items)]
        if isinstance(value, str):
            return ".".join(parts), {TARGET: class_name(value, key, kind)}
        return ".".join(parts), entry(value, key, kind) if isinstance(value, dict) else node(value, key)
    rest = [p for p in parts[1:] if p not in (INIT_ARGS, DICT_KWARGS)]
    if rest and rest[-1] == CLASS_PATH:
        value = class_name(text.strip(), key, section if len(rest) == 1 else "")
        return ".".join([parts[0], *rest[:-1], TARGET]) + "=" + value
    return _nested(".".join([parts[0], *rest]), sep, text)


def _nested(key: str, sep: str, text: str) -> str | tuple[str, Any]:
    """``key=value``, or (key, value in _target_ form) where the value holds class_path entries: an override
    ``--model.init_args.x={class_path: ..., init_args: ...}`` is built (or refused) as the same entry in a
    file is, never handed on as a plain dict."""
    try:
        value = _parse(text)
    except Exception:
        return key + sep + text  # omegaconf reports the text's mistake when it applies the override
    return (key, node(value, key)) if _has_class_path(value) else key + sep + text


def _parse(text: str) -> Any:
    """An override's value, read as omegaconf reads it (YAML)."""
    return OmegaConf.to_container(OmegaConf.from_dotlist([f"v={text}"]), resolve=False)["v"]


def _has_class_path(value: Any) -> bool:
    if isinstance(value, dict):
        return CLASS_PATH in value or any(_has_class_path(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_class_path(v) for v in value)
    return False
