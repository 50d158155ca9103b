"""The schema of a run config: its sections, the ``trainer:`` section (from trainer/options.py) and the
``_target_`` entries, checked against the signatures they name. Example::

    validate({"trainer": {"max_epochs": "3"}})["trainer"]["max_epochs"]  # 3: every option, typed
"""

from __future__ import annotations

import typing
from collections.abc import Sequence
from typing import Any

from tandem_core.errors import ConfigError, did_you_mean
from trainer.config.slots import slot_types
from trainer.config.targets import PARTIAL, TARGET, locate, params
from trainer.config.types import annotations, check, narrow
from trainer.options import OptionError, TrainerConfig

SECTIONS = (
    "seed_everything",
    "trainer",
    "task",
    "data",
    "optimizer",
    "lr_scheduler",
    "callbacks",
    "logger",
    "ckpt_path",
)
# A strategy given as a _target_ entry takes these from the trainer section (one place to set them).
FROM_TRAINER = ("accelerator", "devices", "num_nodes")


def validate(data: Any) -> dict[str, Any]:
    """Check a plain config dict; return it with all sections, Trainer defaults and target defaults filled."""
    if not isinstance(data, dict):
        raise ConfigError(
            f"a config is a mapping of sections ({', '.join(SECTIONS)}), got {type(data).__name__}"
        )
    for key in data:
        if key not in SECTIONS:
            raise ConfigError(
                f"unknown section {key!r}{did_you_mean(str(key), SECTIONS)} (sections: {', '.join(SECTIONS)})"
            )
    seed = data.get("seed_everything", True)
    if not (seed is None or isinstance(seed, bool) or (isinstance(seed, int) and 0 <= seed < 2**32)):
        raise ConfigError(
            f"seed_everything must be an int in [0, 2**32), true (pick one) or false, got {seed!r}"
        )
    out: dict[str, Any] = {"seed_everything": seed, "trainer": _check_trainer(data.get("trainer"))}
    slots = slot_types()
    for name in ("task", "data"):
        out[name] = None if data.get(name) is None else _check_target(data[name], name, slots[name])
    out.update(_check_optim(data.get("optimizer"), data.get("lr_scheduler")))
    for name in ("callbacks", "logger"):
        out[name] = _check_list(data.get(name), name)
    ckpt_path = data.get("ckpt_path")
    if ckpt_path is not None and not isinstance(ckpt_path, str):
        raise ConfigError(f"ckpt_path must be a checkpoint path, 'last' or null, got {ckpt_path!r}")
    out["ckpt_path"] = ckpt_path
    if out["logger"] and out["trainer"]["logger"] is False:
        raise ConfigError(
            "trainer.logger is false but the logger section lists loggers; remove one or the other"
        )
    return out


def _check_trainer(section: Any) -> dict[str, Any]:
    """Every Trainer option: the names, types and checks are TrainerConfig's; strings are coerced first."""
    section = {} if section is None else section
    if not isinstance(section, dict):
        raise ConfigError(f"trainer: expected a mapping of Trainer options, got {section!r}")
    try:
        TrainerConfig.check_names(section)
    except OptionError as e:
        raise ConfigError(
            f"unknown key 'trainer.{e.option}'{e.suggestion} "
            "(every Trainer option is listed in docs/configuration.md)"
        ) from None
    given = TrainerConfig.coerce(section)
    _check_object_forms(given)
    strategy = given.get("strategy")
    if isinstance(strategy, dict):  # built by the config layer; TrainerConfig checks the Strategy it becomes
        strategy = _check_target(
            strategy, "trainer.strategy", slot_types()["strategy"], skip_defaults=(*FROM_TRAINER, "precision")
        )
        given = {k: v for k, v in given.items() if k != "strategy"}
    plugins = given.pop("plugins", None)
    if plugins is not None:  # _target_ entries, built by the config layer (trainer/config/build.py)
        entries = plugins if isinstance(plugins, list) else [plugins]
        plugins = [
            _check_target(p, f"trainer.plugins[{i}]", slot_types()["plugins"]) for i, p in enumerate(entries)
        ]
    try:
        options = TrainerConfig.from_kwargs(**given)
    except OptionError as e:
        raise ConfigError(f"trainer.{e.option}: {e.problem}") from None
    out = {name: getattr(options, name) for name in TrainerConfig.names()}
    if isinstance(strategy, dict):
        out["strategy"] = strategy
    out["plugins"] = plugins or None
    if plugins and "precision" not in given:  # unset (Lightning's None): a precision plugin may set it
        out["precision"] = None
    return out


def _check_object_forms(options: dict[str, Any]) -> None:
    """How a config spells the options whose Python values are objects: a strategy is a name or a
    ``_target_`` entry, loggers and callbacks come from their own top-level sections."""
    if options.get("callbacks") is not None:
        raise ConfigError("trainer.callbacks: list callbacks in the top-level 'callbacks:' section instead")
    logger = options.get("logger", True)
    if not isinstance(logger, bool):
        raise ConfigError(
            f"trainer.logger must be true or false, got {logger!r}; "
            "list logger entries in the top-level 'logger:' section"
        )
    strategy = options.get("strategy", "auto")
    if not isinstance(strategy, (str, dict)):
        raise ConfigError(f"trainer.strategy must be a strategy name or a _target_ entry, got {strategy!r}")


def _check_optim(optimizer: Any, lr_scheduler: Any) -> dict[str, Any]:
    """The optimizer and lr_scheduler sections: classes that build a torch optimizer from the task's
    parameters, and a scheduler from that optimizer (trainer/config/optim.py builds them)."""
    import torch

    from trainer.config.optim import OPTIMIZER, SCHEDULER

    if lr_scheduler is not None and optimizer is None:
        raise ConfigError(
            "lr_scheduler is set but optimizer is not: the scheduler is built on the optimizer section's "
            "optimizer; add optimizer: {class_path: torch.optim.SGD, init_args: {lr: 0.1}} (or remove it)"
        )
    out: dict[str, Any] = {}
    sections = (
        ("optimizer", optimizer, OPTIMIZER, "torch.optim.Optimizer"),
        ("lr_scheduler", lr_scheduler, SCHEDULER, "torch.optim.lr_scheduler.LRScheduler"),
    )
    for name, value, expected, base in sections:
        if value is None:
            out[name] = None
            continue
        if isinstance(value, dict) and TARGET in value:
            obj = locate(value[TARGET], f"{name}._target_")
            if not isinstance(obj, type):
                raise ConfigError(f"{name}: {value[TARGET]!r} is not a class; name a subclass of {base}")
            if not issubclass(obj, typing.get_args(expected)[-1]):
                raise ConfigError(
                    f"{name}: {value[TARGET]!r} is the class {obj.__qualname__}, not a subclass of {base}"
                )
            if obj is torch.optim.lr_scheduler.ReduceLROnPlateau:
                raise ConfigError(
                    "lr_scheduler: torch's ReduceLROnPlateau does not say which metric it watches; use "
                    "ReduceLROnPlateau (trainer.config.optim.ReduceLROnPlateau, Lightning's "
                    "lightning.pytorch.cli.ReduceLROnPlateau) with init_args: {monitor: val/loss}"
                )
        checked = _check_target(value, name, expected, partial=True)  # its first argument comes later
        first, *rest = [p for p in params(locate(checked[TARGET])) or [] if p.kind != p.VAR_KEYWORD] or [None]
        missing = [p.name for p in rest if p.default is p.empty and p.kind != p.VAR_POSITIONAL]
        missing = [n for n in missing if n not in checked]
        if missing:
            raise ConfigError(
                f"{name}: {checked[TARGET]} needs {', '.join(repr(n) for n in missing)}; set it under "
                f"{name}.init_args (LightningCLI's form) or {name}"
            )
        out[name] = {k: v for k, v in checked.items() if k != PARTIAL}
    return out


def _check_list(value: Any, name: str) -> list[dict[str, Any]]:
    if value is None:
        return []
    if isinstance(value, dict) and TARGET in value:
        value = [value]  # a single entry
    if not isinstance(value, list):
        hint = "; to turn logging off set trainer.logger: false" if name == "logger" else ""
        raise ConfigError(f"{name}: expected a list of _target_ entries, got {value!r}{hint}")
    return [_check_target(v, f"{name}[{i}]", slot_types()[name]) for i, v in enumerate(value)]


def _check_target(
    node: Any, where: str, expected: Any, skip_defaults: Sequence[str] = (), partial: bool | None = None
) -> dict[str, Any]:
    """Check that a ``_target_`` entry imports, that `where` may build it (a subclass of `expected`, the
    slot's type or the annotation of the parameter it fills; nothing is called) and that its arguments
    match the signature; fill defaults."""
    if not isinstance(node, dict) or TARGET not in node:
        raise ConfigError(
            f"{where}: expected a mapping with _target_ (an import path such as examples.digits.DigitsTask) "
            f"and the arguments (or LightningCLI's class_path and init_args), got {node!r}"
        )
    target, partial = node[TARGET], node.get(PARTIAL, False) if partial is None else partial
    obj = locate(target, f"{where}._target_")
    if not isinstance(partial, bool):
        raise ConfigError(f"{where}._partial_ must be true or false, got {partial!r}")
    check(obj, target, expected, partial, where)
    args: dict[str, Any] = {}
    for key, value in node.items():
        if key in (TARGET, PARTIAL):
            continue
        if not isinstance(key, str) or not key.isidentifier():
            raise ConfigError(f"{where}: argument names are identifiers, got {key!r}")
        args[key] = value
    signature = params(obj)
    out: dict[str, Any] = {TARGET: target, **({PARTIAL: True} if partial else {})}
    named_types, rest = annotations(obj)
    if signature is None:  # no signature to check against (some builtins)
        return {**out, **{k: _check_value(v, f"{where}.{k}", rest) for k, v in args.items()}}
    named = [p.name for p in signature if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    if not any(p.kind == p.VAR_KEYWORD for p in signature):
        for key in args:
            if key not in named:
                raise ConfigError(
                    f"unknown key '{where}.{key}': {target} has no argument {key!r}{did_you_mean(key, named)} "
                    f"(its arguments: {', '.join(named) or 'none'})"
                )
    args = {k: _check_value(v, f"{where}.{k}", named_types.get(k, rest)) for k, v in args.items()}
    required = [p.name for p in signature if p.name in named and p.default is p.empty and p.name not in args]
    if required and not partial:
        raise ConfigError(
            f"{where}: {target} needs {', '.join(repr(n) for n in required)}; set them under {where}"
        )
    for p in signature:  # the signature's order, with its defaults: the saved config does not depend on them
        if p.name in args:
            out[p.name] = args.pop(p.name)
        elif p.name in named and p.name not in skip_defaults and _is_scalar(p.default):
            out[p.name] = p.default
    return {**out, **args}


def _check_value(value: Any, where: str, expected: Any) -> Any:
    """An argument's value, its nested ``_target_`` entries checked against `expected` (its annotation)."""
    if isinstance(value, dict):
        if TARGET in value:
            return _check_target(value, where, expected)
        return {k: _check_value(v, f"{where}.{k}", narrow(expected, str(k))) for k, v in value.items()}
    if isinstance(value, list):
        return [_check_value(v, f"{where}[{i}]", narrow(expected, i)) for i, v in enumerate(value)]
    return value


def _is_scalar(value: Any) -> bool:
    return value is None or type(value) in (bool, int, float, str)
