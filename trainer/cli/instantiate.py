"""Building from LightningCLI's config form outside the CLI: `instantiate_class` (an optimizer or scheduler
from a ``{class_path, init_args}`` dict, in a task's own code) and `instantiate_module` (a task or DataModule
from the hyperparameters a LightningCLI run saved, for ``load_from_checkpoint``). Example::

    optimizer = instantiate_class(self.parameters(), self.hparams.optimizer_config)

Both build only what Tandem's trust rules allow: a dict is data, so `instantiate_class` builds the known
classes only (optimizers, schedulers, torch Modules), and a checkpoint is data, so `instantiate_module` never
imports a module because the checkpoint names it: every class it names must already be imported (the
program imported it), and be a subclass of the class ``load_from_checkpoint`` was called on.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from typing import Any

from tandem_core.errors import CheckpointError, ConfigError
from trainer.config.types import KNOWN_TEXT, _known
from trainer.task.hparams import given_hyperparameters

#: the names a checkpoint's ``_instantiator`` may give (LightningCLI's, as Lightning and Tandem write it);
#: each means this module's `instantiate_module`, whatever module the name says
INSTANTIATORS = (
    "trainer.cli.instantiate_module",
    "lightning.pytorch.cli.instantiate_module",
    "pytorch_lightning.cli.instantiate_module",
)
INSTANTIATOR = INSTANTIATORS[0]  # what a LightningCLI run stores


def instantiate_class(args: Any, init: dict[str, Any]) -> Any:
    """``Class(*args, **init["init_args"])`` for ``init = {"class_path": "torch.optim.Adam", "init_args": {...}}``;
    `args` is one positional argument or a tuple of them. Only optimizers, schedulers and torch Modules."""
    path = init.get("class_path") if isinstance(init, dict) else None
    if not isinstance(path, str) or "." not in path:
        raise ConfigError(f"instantiate_class: expected {{'class_path': 'module.Class', ...}}, got {init!r}")
    module, _, name = path.rpartition(".")
    cls = getattr(importlib.import_module(module), name, None)
    if cls is None:
        raise ConfigError(f"instantiate_class: {module!r} has no {name!r}")
    if not _known(cls) or not isinstance(cls, type):
        raise ConfigError(
            f"instantiate_class: {path!r} is not one of the classes a config dict may build ({KNOWN_TEXT}); "
            "build other classes in your own code"
        )
    return cls(*(args if isinstance(args, tuple) else (args,)), **(init.get("init_args") or {}))


def instantiate_module(class_type: type, config: dict[str, Any]) -> Any:
    """`class_type` (or the ``_class_path`` subclass a LightningCLI run saved) built from its saved config,
    parsed by jsonargparse and trust-checked as LightningCLI's values are."""
    from jsonargparse import ArgumentParser

    from trainer.cli.trust import check_values

    config = dict(config)
    saved_classes_imported(class_type, config)
    parser = ArgumentParser(exit_on_error=False)
    if "_class_path" in config:
        path = config.pop("_class_path")
        cls = already_imported(path, "_class_path")
        if not (isinstance(cls, type) and issubclass(cls, class_type)):
            raise CheckpointError(
                f"the checkpoint's class {path!r} is not a subclass of {class_type.__name__}: load it with "
                "that class's own load_from_checkpoint"
            )
        parser.add_subclass_arguments(class_type, "module", fail_untyped=False)
        config = {"class_path": path, "dict_kwargs": config}
    else:
        parser.add_class_arguments(class_type, "module", fail_untyped=False)
    parsed = parser.parse_object({"module": config})
    check_values(parser, parsed)
    return parser.instantiate(parsed).module


def rebuild(cls: type, hparams: dict[str, Any], overrides: dict[str, Any], path: str) -> Any:
    """load_from_checkpoint of a task or DataModule that a LightningCLI run saved (its hyperparameters hold
    ``_instantiator``): rebuilt from the saved config, `overrides` winning. Only LightningCLI's own
    instantiator names are taken, each meaning `instantiate_module` (nothing named by the file is called)."""
    name = hparams.get("_instantiator")
    if name not in INSTANTIATORS:
        raise CheckpointError(
            f"checkpoint {path!r} asks to be built by {name!r}, which is not LightningCLI's instantiator "
            f"({INSTANTIATORS[0]}); a checkpoint never chooses the code that builds the model"
        )
    config = {k: v for k, v in hparams.items() if k != "_instantiator"}
    config.update(overrides)
    if "_class_path" not in config and not _takes_kwargs(cls):  # as Lightning: only what __init__ takes
        taken = set(inspect.signature(cls).parameters)
        config = {k: v for k, v in config.items() if k in taken}
    return instantiate_module(cls, config)


def _takes_kwargs(cls: type) -> bool:
    return any(p.kind == p.VAR_KEYWORD for p in inspect.signature(cls).parameters.values())


def already_imported(path: Any, where: str) -> Any:
    """The object at import path `path`, found among the modules already imported: a checkpoint never makes
    Tandem import a module (importing runs its code). A CheckpointError says which module to import."""
    if not isinstance(path, str) or not all(p.isidentifier() for p in path.split(".")):
        raise CheckpointError(f"{where}: {path!r} is not an import path")
    parts = path.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        module = sys.modules.get(".".join(parts[:cut]))
        if module is None:
            continue
        obj: Any = module
        for attr in parts[cut:]:
            obj = getattr(obj, attr, None)
        if obj is not None:
            return obj
    raise CheckpointError(
        f"{where}: the checkpoint names {path!r}, which is not imported in this program; a checkpoint is data "
        f"and never makes Tandem import a module. If you trust it, import {parts[0]}... first."
    )


def saved_classes_imported(class_type: type, config: dict[str, Any]) -> None:
    """Every class the saved config of a `class_type` names is already imported (else CheckpointError): the
    config in LightningCLI's form (``class_path``/``dict_kwargs``, or ``_class_path``), or the arguments."""
    from trainer.config.types import annotations

    if any(k in config for k in ("class_path", "_class_path")):
        imported_only(config, class_type.__name__)
        return
    named, rest = annotations(class_type)
    for key, item in config.items():
        imported_only(item, f"{class_type.__name__}.{key}", named.get(key, rest))


def imported_only(value: Any, where: str, ann: Any = None) -> None:
    """Every class in saved hyperparameters (a ``class_path``, or an import path where the parameter takes a
    callable or a class) is already imported (else CheckpointError); `ann` is the parameter's annotation."""
    from trainer.config.types import _callable_returns, _members, annotations, narrow

    if isinstance(value, dict) and ("class_path" in value or "_class_path" in value):
        path = value.get("class_path", value.get("_class_path"))
        cls = already_imported(path, f"{where}.class_path")
        named, rest = annotations(cls)
        args = {**(value.get("init_args") or {}), **(value.get("dict_kwargs") or {})}
        args.update({k: v for k, v in value.items() if k not in ("class_path", "_class_path", "init_args",
                                                              "dict_kwargs")})  # fmt: skip
        for key, item in args.items():
            imported_only(item, f"{where}.{key}", named.get(key, rest))
    elif isinstance(value, dict):
        for key, item in value.items():
            imported_only(item, f"{where}.{key}", narrow(ann, str(key)))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            imported_only(item, f"{where}[{i}]", narrow(ann, i))
    elif isinstance(value, str) and "." in value:
        takes_class = any(
            _callable_returns(m) is not None or m is type or getattr(m, "__origin__", None) is type
            for m in _members(ann)
        )
        if takes_class:
            already_imported(value, where)


class CliInstantiator:
    """Builds the model or DataModule with its hyperparameters recorded as the parsed config, so that
    ``load_from_checkpoint`` can rebuild its nested classes (trainer/cli/instantiate.py)."""

    def __init__(self, cli: Any, key: str) -> None:
        self.cli, self.key = cli, key

    def __call__(self, class_type: type, *args: Any, applied_instantiation_links: dict, **kwargs: Any) -> Any:
        self.cli._dump_config()
        hparams = dict(self.cli.config_dump.get(self.key) or {})
        if (
            "class_path" in hparams
        ):  # kept flat, the class apart: the same form with and without subclass mode
            hparams = {"_class_path": hparams["class_path"], **(hparams.get("init_args") or {}),
                       **(hparams.get("dict_kwargs") or {})}  # fmt: skip
        for target, value in applied_instantiation_links.items():  # values linked in when building
            if target.startswith(f"{self.key}."):
                parts = target[len(self.key) + 1 :].split(".")
                parts = parts[1:] if parts[0] == "init_args" else parts
                _set_nested(hparams, parts, value)
        with given_hyperparameters(hparams, INSTANTIATOR):
            return class_type(*args, **kwargs)


def _set_nested(data: dict[str, Any], keys: list[str], value: Any) -> None:
    for key in keys[:-1]:
        data = data.setdefault(key, {})
    data[keys[-1]] = value


def module_type(value: Any) -> type:
    if callable(value) and not isinstance(value, type):
        return inspect.signature(value).return_annotation
    return value
