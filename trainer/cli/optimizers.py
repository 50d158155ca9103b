"""LightningCLI's automatic optimizers: ``--optimizer=Adam --lr_scheduler=StepLR --lr_scheduler.step_size=5``
give the model a configure_optimizers that builds them on its parameters. Example::

    attach_automatic(cli, parser)   # model.configure_optimizers() -> [Adam(...)], [StepLR(...)]

As in Lightning, at most one optimizer and one scheduler group may be AUTOMATIC (no ``link_to``), and a model
that defines configure_optimizers itself is warned that it is replaced. Unlike Lightning, which builds the
optimizer once, when the CLI builds the model, it is built when the Trainer calls configure_optimizers (after
the strategy has set the model up, so that it holds the sharded parameters under fsdp), from the same classes
and arguments: each call builds a new one.
"""

from __future__ import annotations

import warnings
from types import MethodType
from typing import Any

import torch

from tandem_core.errors import ConfigError
from tandem_core.hooks import overrides
from trainer.cli.instantiate import instantiate_class
from trainer.cli.types import LRSchedulerTypeTuple

AUTOMATIC = "AUTOMATIC"


class AutomaticOptimizers:
    """The configure_optimizers the CLI gives a model (bound to it): builds the optimizer (and scheduler)
    from their ``{class_path, init_args}`` and returns ``configure(model, optimizer=..., lr_scheduler=...)``."""

    def __init__(self, configure: Any, optimizer: dict[str, Any], scheduler: dict[str, Any] | None) -> None:
        self.configure, self.optimizer, self.scheduler = configure, optimizer, scheduler

    def __call__(self, model: Any) -> Any:
        optimizer = instantiate_class(model.parameters(), self.optimizer)
        scheduler = instantiate_class(optimizer, self.scheduler) if self.scheduler else None
        return self.configure(model, optimizer=optimizer, lr_scheduler=scheduler)


def attach_automatic(cli: Any, parser: Any) -> None:
    """Give `cli.model` the configure_optimizers of the parsed AUTOMATIC optimizer and scheduler, if given."""
    optimizers = _automatic(parser._optimizers, (torch.optim.Optimizer,))
    schedulers = _automatic(parser._lr_schedulers, LRSchedulerTypeTuple)
    if not optimizers:
        return
    if len(optimizers) > 1 or len(schedulers) > 1:
        raise ConfigError(
            f"{type(cli).__name__}: at most one optimizer and one lr_scheduler may be AUTOMATIC, found "
            f"{optimizers + schedulers}; give the others link_to=... (a model argument) and write the model's "
            "configure_optimizers"
        )
    optimizer = _init_of(cli, parser._optimizers, optimizers[0])
    if not optimizer:  # the arguments were added automatically and not given
        return
    scheduler = _init_of(cli, parser._lr_schedulers, schedulers[0]) if schedulers else None
    model = cli.model
    if overrides(model, "configure_optimizers"):
        warnings.warn(
            f"`{type(model).__name__}.configure_optimizers` will be overridden by "
            f"`{type(cli).__name__}.configure_optimizers`.",
            UserWarning,
            stacklevel=4,
        )
    model.configure_optimizers = MethodType(
        AutomaticOptimizers(cli.configure_optimizers, optimizer, scheduler), model
    )


def class_path_dict(cls: type, init_args: Any) -> dict[str, Any]:
    """``{"class_path": ..., "init_args": ...}`` of a class and its parsed arguments."""
    if hasattr(init_args, "as_dict"):
        init_args = init_args.as_dict()
    return {"class_path": f"{cls.__module__}.{cls.__name__}", "init_args": init_args or {}}


def _init_of(cli: Any, register: dict[str, tuple[Any, str]], key: str) -> Any:
    classes = register[key][0]
    init = cli._get(cli.config_init, key)
    if not isinstance(classes, tuple):
        return class_path_dict(classes, init)
    return init.as_dict() if hasattr(init, "as_dict") else init


def _automatic(register: dict[str, tuple[Any, str]], kinds: tuple[type, ...]) -> list[str]:
    """The keys of `register` whose classes are of `kinds` and that have no link_to."""
    found = []
    for key, (classes, link_to) in register.items():
        each = classes if isinstance(classes, tuple) else (classes,)
        if link_to == AUTOMATIC and any(issubclass(c, kinds) for c in each):
            found.append(key)
    return found
