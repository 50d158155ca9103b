"""LightningCLI under Tandem's trust rules: every class and callable a command line or config file names is
checked against the parameter it fills, BEFORE jsonargparse builds anything (docs/configuration.md, "Trust").

jsonargparse already refuses a ``class_path`` that is not a subclass of a parameter's class. What it would
take beyond Tandem's rules, and this refuses with a ConfigError naming the key and what to change:

- a function or class for a bare ``Callable`` (``--model.fn=os.system``): only the known callables
  (functions of ``torch.nn.functional``/``torch.nn.init``, subclasses of Module, Optimizer, LRScheduler);
- a callable for ``Callable[..., R]`` or ``type[R]`` that is not known to give an R (by its class, or a
  function's return annotation);
- a ``class_path`` where the parameter has no type (or ``Any``): jsonargparse would build whatever it names.

Values that are the signature's own defaults are the program's, not the config's, and are not checked.
Example::

    check_values(parser, cfg)   # ConfigError: model.init_args.fn: _partial_: true passes 'os.system' uncalled ...
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable, Mapping
from typing import Any

from tandem_core.errors import ConfigError
from trainer.config.targets import locate
from trainer.config.types import KNOWN_TEXT, _is_any, _members, annotations, check, describe, narrow

_CLASS_PATH, _INIT_ARGS, _DICT_KWARGS = "class_path", "init_args", "dict_kwargs"
_SPEC_KEYS = {_CLASS_PATH, _INIT_ARGS, _DICT_KWARGS, "__path__"}


def check_values(parser: Any, cfg: Any) -> None:
    """Check every value of `cfg` (a jsonargparse Namespace the `parser` parsed) that names a class or a
    callable, against the type of the argument it fills."""
    from jsonargparse._typehints import ActionTypeHint  # the one action whose values may name classes

    for action in getattr(parser, "_actions", []):
        if not isinstance(action, ActionTypeHint):
            continue
        try:
            value = cfg.get(action.dest)
        except (KeyError, AttributeError, TypeError):
            continue
        if _same(value, action.default):
            continue
        _walk(value, action._typehint, action.dest)


def _walk(value: Any, ann: Any, where: str) -> None:
    """Check `value`, given for a parameter annotated `ann`, and everything nested in it."""
    ann = _as_callable(ann)
    if _is_spec(value):
        _check_spec(_entries(value), ann, where)
    elif _is_callable_value(value):
        target = _path_of(value)
        try:
            check(value, target, ann, True, where)
        except ConfigError:
            raise ConfigError(
                f"{where}: {target!r} would be passed uncalled, but {where} takes {describe(ann)} and {target!r} is "
                f"not known to be one: a Callable[..., X] (or type[X]) takes a subclass of X or a function annotated "
                f"to return X; a bare Callable only {KNOWN_TEXT}. Annotate the parameter with the class X it builds."
            ) from None
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _walk(item, narrow(ann, i), f"{where}[{i}]")
    elif isinstance(value, Mapping) or _is_namespace(value):
        entries = _entries(value)
        classes = [m for m in _members(ann) if inspect.isclass(m) and not issubclass(m, Mapping)]
        if len(classes) == 1 and not _is_namespace(value):  # a plain mapping for a class: data, not built
            return
        if len(classes) == 1:  # a class with subclasses disabled: its arguments without class_path
            _check_arguments(classes[0], entries, where)
            return
        for key, item in entries.items():
            _walk(item, narrow(ann, str(key)), f"{where}.{key}")


def _check_spec(spec: dict[str, Any], ann: Any, where: str) -> None:
    """A ``{class_path, init_args, dict_kwargs}`` entry: jsonargparse builds it (or a partial of it for a
    Callable). It must be a class the parameter takes, and so must everything in its arguments."""
    members = _members(ann)
    if members and all(_is_data_type(m) for m in members if m is not type(None)):
        return  # a dict (or str, list) parameter: jsonargparse passes the mapping on as data
    path = spec.get(_CLASS_PATH)
    cls = locate(path, f"{where}.class_path")
    if getattr(cls, "refused_because", ""):  # a Lightning class Tandem names but does not build (CometLogger)
        raise ConfigError(f"{where}: {cls.refused_because}")
    try:
        check(cls, str(path), ann, False, where)
    except ConfigError:
        try:  # for a Callable[..., R]: a class that builds an R, passed as a partial of its init_args
            check(cls, str(path), ann, True, where)
        except ConfigError:
            untyped = all(_is_any(m) for m in members if m is not type(None))
            why = (
                "a parameter with no type (or Any) takes no class_path: annotate it with the class it takes"
                if untyped
                else f"it takes {describe(ann)}"
            )
            raise ConfigError(f"{where}: class_path {path!r} is refused: {why}") from None
    _check_arguments(cls, {**dict(_entries(spec.get(_INIT_ARGS) or {})), **_dict_kwargs(spec)}, where)


def _check_arguments(cls: Any, arguments: dict[str, Any], where: str) -> None:
    named, rest = annotations(cls)
    defaults = _defaults(cls)
    for key, item in arguments.items():
        if str(key).startswith("__") or (key in defaults and _same(item, defaults[key])):
            continue
        _walk(item, named.get(key, rest), f"{where}.init_args.{key}")


def _dict_kwargs(spec: dict[str, Any]) -> dict[str, Any]:
    return dict(_entries(spec.get(_DICT_KWARGS) or {}))


def _as_callable(ann: Any) -> Any:
    """``type[X]`` as ``Callable[..., X]`` (a class passed uncalled, which the receiver calls to build an X)
    and a bare ``type`` as a bare ``Callable``; unions member by member."""
    if ann is type:
        return Callable
    origin = typing.get_origin(ann)
    if origin is type:
        args = typing.get_args(ann)
        return Callable[..., args[0]] if args else Callable  # type: ignore[misc]
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", typing.Union)):
        members = tuple(_as_callable(m) for m in typing.get_args(ann))
        return typing.Union[members]  # noqa: UP007
    return ann


def _is_data_type(ann: Any) -> bool:
    cls = typing.get_origin(ann) or ann
    return inspect.isclass(cls) and issubclass(cls, (Mapping, str, int, float, bool, list, tuple))


def _is_namespace(value: Any) -> bool:
    return type(value).__name__ == "Namespace" and type(value).__module__.startswith("jsonargparse")


def _entries(value: Any) -> dict[str, Any]:
    if _is_namespace(value):
        return {k: v for k, v in vars(value).items() if not k.startswith("__")}
    return dict(value)


def _is_spec(value: Any) -> bool:
    if not (isinstance(value, Mapping) or _is_namespace(value)):
        return False
    keys = set(_entries(value))
    return _CLASS_PATH in keys and keys <= _SPEC_KEYS


def _is_callable_value(value: Any) -> bool:
    """A class or a function given as a value (jsonargparse resolved an import path to it)."""
    return inspect.isclass(value) or inspect.isroutine(value) or isinstance(value, functools.partial)


def _path_of(obj: Any) -> str:
    obj = obj.func if isinstance(obj, functools.partial) else obj
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"


def _defaults(cls: Any) -> dict[str, Any]:
    try:
        params = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):
        return {}
    return {p.name: p.default for p in params if p.default is not p.empty}


def _same(value: Any, default: Any) -> bool:
    """Is `value` the program's own default (then the config did not choose it)?"""
    if value is default:
        return True
    try:
        return bool(type(value) is type(default) and value == default)
    except Exception:  # tensors and other values without a plain truth value
        return False
