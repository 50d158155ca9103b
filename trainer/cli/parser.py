"""LightningArgumentParser: jsonargparse's ArgumentParser with Lightning's additions (a Trainer, Task,
DataModule or Callback class's arguments under a key; optimizer and scheduler arguments), reading configs
as Tandem does. Example::

    parser = LightningArgumentParser()
    parser.add_lightning_class_args(Trainer, "trainer")
    parser.add_lightning_class_args(MyTask, "model")
    cfg = parser.parse_args(["--trainer.max_epochs=3", "--model.lr=0.1"])
    init = parser.instantiate(cfg)            # checked against the trust rules first (trainer/cli/trust.py)

What differs from jsonargparse's own parser: config files and values are read with YAML's safe loader, in
which Lightning's own class paths (``lightning.pytorch.callbacks.ModelCheckpoint``) name Tandem's class of the
same name, as `tandem fit --config` reads them (trainer/config/lightning_form.py); and
``parser_mode="omegaconf"`` is refused (its ``${oc.env:...}`` values would be written into
the saved config in clear: use `tandem fit --config`, which interpolates and redacts them).
"""

from __future__ import annotations

import importlib.metadata
from typing import Any

from tandem_core.errors import ConfigError, MissingExtraError
from trainer.config.lightning_form import tandem_name

MIN_JSONARGPARSE = (4, 49)  # ArgumentParser.instantiate, where the trust check runs
MODE = "tandem_yaml"  # YAML (safe loader) with Lightning's class paths read as Tandem's


def _jsonargparse_version() -> tuple[int, ...] | None:
    try:
        text = importlib.metadata.version("jsonargparse")
    except importlib.metadata.PackageNotFoundError:
        return None
    return tuple(int(p) for p in text.split(".")[:2] if p.isdigit())


def _available() -> bool:
    found = _jsonargparse_version()
    if found is None or found < MIN_JSONARGPARSE:
        return False
    try:
        import docstring_parser  # noqa: F401 (jsonargparse[signatures]: help from docstrings)
    except ImportError:
        return False
    return True


AVAILABLE = _available()


def require_jsonargparse() -> None:
    """A MissingExtraError naming the `cli` extra unless jsonargparse (with its signatures extra) is here."""
    if not AVAILABLE:
        found = _jsonargparse_version()
        have = f" (found jsonargparse {'.'.join(map(str, found))})" if found else ""
        raise MissingExtraError(
            "LightningCLI needs jsonargparse[signatures] >= "
            f"{'.'.join(map(str, MIN_JSONARGPARSE))}{have}: pip install 'tandem-trainer[cli]'. "
            "(`tandem fit --config config.yaml` reads the same config files without it.)"
        )


if AVAILABLE:
    import torch
    from jsonargparse import ArgumentParser, Namespace, register_unresolvable_import_paths, set_loader
    from jsonargparse._loaders_dumpers import yaml_load

    register_unresolvable_import_paths(torch)  # torch's classes whose __module__ is not where they import

    def _load(text: str) -> Any:
        return tandem_paths(yaml_load(text))

    set_loader(MODE, _load, exceptions=(__import__("yaml").YAMLError,))
else:  # the class statement below still works; building a parser raises MissingExtraError
    ArgumentParser = object  # type: ignore[assignment,misc]
    Namespace = dict  # type: ignore[assignment,misc]


def tandem_paths(value: Any) -> Any:
    """A loaded YAML value with Lightning's class paths (a ``class_path``, or a whole value such as
    ``--trainer.callbacks=lightning.pytorch.callbacks.EarlyStopping``) as Tandem's."""
    if isinstance(value, str):
        return tandem_name(value) or value
    if isinstance(value, list):
        return [tandem_paths(v) for v in value]
    if isinstance(value, dict):
        return {k: tandem_paths(v) if k != "init_args" else _tandem_nested(v) for k, v in value.items()}
    return value


def _tandem_nested(value: Any) -> Any:
    """Arguments: only the class paths nested in them change, never a plain string argument."""
    if isinstance(value, dict):
        if "class_path" in value:
            return tandem_paths(value)
        return {k: _tandem_nested(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_tandem_nested(v) for v in value]
    return value


class LightningArgumentParser(ArgumentParser):  # type: ignore[misc,valid-type]
    """Lightning's LightningArgumentParser: ``add_lightning_class_args``, ``add_optimizer_args``,
    ``add_lr_scheduler_args`` on jsonargparse, under Tandem's config and trust rules."""

    def __init__(
        self,
        *args: Any,
        description: str = "Lightning Trainer command line tool",
        env_prefix: str = "PL",
        default_env: bool = False,
        **kwargs: Any,
    ) -> None:
        require_jsonargparse()
        mode = kwargs.pop("parser_mode", "yaml")
        if str(mode).startswith("omegaconf"):
            raise ConfigError(
                f"LightningCLI(parser_kwargs={{'parser_mode': {mode!r}}}) is refused: its ${{oc.env:...}} values "
                "would be written into the saved config.yaml in clear. `tandem fit --config config.yaml` reads "
                "the same file with interpolation, and writes environment values as ${oc.env:NAME} (docs/"
                "configuration.md, 'Trust')."
            )
        kwargs["parser_mode"] = MODE if mode == "yaml" else mode
        super().__init__(
            *args, description=description, env_prefix=env_prefix, default_env=default_env, **kwargs
        )
        self.callback_keys: list[str] = []
        # the optimizer and scheduler argument groups added, each with its class(es) and link_to
        self._optimizers: dict[str, tuple[Any, str]] = {}
        self._lr_schedulers: dict[str, tuple[Any, str]] = {}

    def add_lightning_class_args(
        self, lightning_class: Any, nested_key: str, subclass_mode: bool = False, required: bool = True
    ) -> list[str]:
        """Add the arguments of a Trainer, Task, DataModule or Callback class (or of a function that returns
        one) under `nested_key`; `subclass_mode`: any subclass, chosen by ``--key=ClassName``."""
        from jsonargparse import class_from_function

        from callbacks.base import Callback
        from trainer.readback import (
            TrainerReadback as Trainer,
        )  # every Trainer's base (no import of the Trainer)
        from trainer.task.base import Task
        from trainer.task.datamodule import DataModule

        if callable(lightning_class) and not isinstance(lightning_class, type):
            lightning_class = class_from_function(lightning_class)
        kinds = (Trainer, Task, DataModule, Callback)
        if not (isinstance(lightning_class, type) and issubclass(lightning_class, kinds)):
            raise ConfigError(
                f"Cannot add arguments from {lightning_class!r}: give a subclass of Trainer, Task (LightningModule), "
                "DataModule or Callback, or a function that returns one."
            )
        if issubclass(lightning_class, Callback):
            self.callback_keys.append(nested_key)
        if subclass_mode:
            return self.add_subclass_arguments(
                lightning_class, nested_key, fail_untyped=False, required=required
            )
        return self.add_class_arguments(
            lightning_class,
            nested_key,
            fail_untyped=False,
            instantiate=not issubclass(lightning_class, Trainer),  # LightningCLI builds the Trainer itself
            sub_configs=True,
        )

    def add_optimizer_args(
        self, optimizer_class: Any = None, nested_key: str = "optimizer", link_to: str = "AUTOMATIC"
    ) -> None:
        """Add an optimizer's arguments (a class, or a tuple of classes to choose from) under `nested_key`;
        `link_to` names a key to pass them to, or AUTOMATIC (LightningCLI's configure_optimizers)."""
        optimizer_class = (torch.optim.Optimizer,) if optimizer_class is None else optimizer_class
        self._add_optim(optimizer_class, nested_key, {"params"}, (torch.optim.Optimizer,))
        self._optimizers[nested_key] = (optimizer_class, link_to)

    def add_lr_scheduler_args(
        self, lr_scheduler_class: Any = None, nested_key: str = "lr_scheduler", link_to: str = "AUTOMATIC"
    ) -> None:
        """Add a learning-rate scheduler's arguments (a class, or a tuple of classes) under `nested_key`."""
        from trainer.cli.types import LRSchedulerTypeTuple

        lr_scheduler_class = LRSchedulerTypeTuple if lr_scheduler_class is None else lr_scheduler_class
        self._add_optim(lr_scheduler_class, nested_key, {"optimizer"}, LRSchedulerTypeTuple)
        self._lr_schedulers[nested_key] = (lr_scheduler_class, link_to)

    def _add_optim(self, classes: Any, key: str, skip: set[str], bases: tuple[type, ...]) -> None:
        each = classes if isinstance(classes, tuple) else (classes,)
        wrong = [c for c in each if not (isinstance(c, type) and issubclass(c, bases))]
        if wrong:
            raise ConfigError(
                f"{key}: {wrong[0]!r} is not a subclass of {' or '.join(b.__name__ for b in bases)}"
            )
        options: dict[str, Any] = {"instantiate": False, "fail_untyped": False, "skip": skip}
        if isinstance(classes, tuple):
            self.add_subclass_arguments(classes, key, **options)
        else:
            self.add_class_arguments(classes, key, sub_configs=True, **options)

    def instantiate(self, namespace: Any, *args: Any, **kwargs: Any) -> Any:
        """jsonargparse's instantiate, after every class and callable the values name passed the trust check."""
        from trainer.cli.trust import check_values

        check_values(self, namespace)
        return super().instantiate(namespace, *args, **kwargs)
