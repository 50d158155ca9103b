"""What a ``_target_`` may name where it stands, checked BEFORE anything is called.

A slot (``task``, ``data``, ``callbacks``, ``logger``, ``trainer.strategy``) takes subclasses of its type; a
nested entry takes what the annotation of the parameter it fills says. Only classes are called to build a
value; a function is allowed only with ``_partial_: true`` where the parameter takes a callable (then it is
passed, not called). Example::

    check(os.system, "os.system", Task, False, "task")  # ConfigError: ... is a builtin function, not a ...
"""

from __future__ import annotations

import collections.abc
import inspect
import sys
import types
import typing
from typing import Any

from trainer.errors import ConfigError

_UNION = (typing.Union, types.UnionType)
_ITEMS = (list, tuple, set, frozenset, collections.abc.Sequence, collections.abc.Iterable)
_ITEMS += (collections.abc.MutableSequence, collections.abc.Set, collections.abc.Collection)
_VALUES = (dict, collections.abc.Mapping, collections.abc.MutableMapping)


def slot_types() -> dict[str, type]:
    """The type each top-level slot builds (imported here, on first use: the config layer loads no Trainer)."""
    from callbacks.base import Callback
    from strategies.base import Strategy
    from trainer.loggers import Logger
    from trainer.task.base import Task
    from trainer.task.datamodule import DataModule

    return {"task": Task, "data": DataModule, "callbacks": Callback, "logger": Logger, "strategy": Strategy}


def annotations(obj: Any) -> tuple[dict[str, Any], Any]:
    """The annotated type of each named parameter of `obj` (Any where there is none), and of its ``**kwargs``."""
    try:
        sig = inspect.signature(obj, eval_str=True)
    except Exception:  # an annotation only importable under TYPE_CHECKING: resolve the others one by one
        try:
            sig = inspect.signature(obj)
        except (TypeError, ValueError):  # no signature (some builtins): nothing to check against
            return {}, Any
    scope = getattr(_code_of(obj), "__globals__", {})
    named: dict[str, Any] = {}
    rest: Any = Any
    for p in sig.parameters.values():
        ann = Any if p.annotation is p.empty else p.annotation
        if isinstance(ann, str):
            ann = _evaluate(ann, scope)
        if p.kind == p.VAR_KEYWORD:
            rest = ann
        elif p.kind != p.VAR_POSITIONAL:
            named[p.name] = ann
    return named, rest


def narrow(ann: Any, key: int | str) -> Any:
    """The annotation of item `key` (an int: a list index; a str: a mapping key) of a value annotated `ann`."""
    found: list[Any] = []
    for m in _members(ann):
        if _is_any(m):
            return Any
        origin, args = typing.get_origin(m) or m, typing.get_args(m)
        if isinstance(key, int) and origin in _ITEMS:
            fixed = origin is tuple and args and args[-1] is not ...
            found.extend(args if fixed else [args[0] if args else Any])  # tuple[X, Y]: either
        elif isinstance(key, str) and origin in _VALUES:
            found.append(args[1] if len(args) == 2 else Any)
    if not found:  # a mapping or list where the annotation names none: nothing to check against
        return Any
    return found[0] if len(found) == 1 else typing.Union[tuple(found)]  # noqa: UP007 (members may be strings)


def check(obj: Any, target: str, expected: Any, partial: bool, where: str) -> None:
    """Refuse (ConfigError) a target that `where` may not build, before it is called."""
    members = [m for m in _members(expected) if m is not type(None)]
    wants = " or ".join(describe(m) for m in members) or "nothing built"
    if partial:
        for m in members:
            if _is_any(m):
                return
            returns = _callable_returns(m)
            if returns is not None and (_is_any(returns) or _builds(obj, returns)):
                return
        raise ConfigError(
            f"{where}: _partial_: true passes {target!r} uncalled, but {where} takes {wants}, not a callable "
            f"that builds one; remove _partial_ or name a class the slot takes"
        )
    if not inspect.isclass(obj):
        hint = "; to pass it uncalled add _partial_: true" if any(_takes_callable(m) for m in members) else ""
        raise ConfigError(
            f"{where}: _target_ {target!r} is a {_kind(obj)}, not a subclass of {wants}; a config builds "
            f"objects of the classes a slot takes and calls no functions{hint}"
        )
    for m in members:
        if _subclass(obj, m) or (_callable_returns(m) is not None and _defines_call(obj)):
            return
    if any(_is_any(m) for m in members) or not members:
        raise ConfigError(
            f"{where}: _target_ {target!r} fills a parameter with no type to check it against "
            f"({describe(expected)}); annotate that parameter with the class it takes"
        )
    raise ConfigError(f"{where}: _target_ {target!r} is the class {describe(obj)}, not a subclass of {wants}")


def _members(ann: Any) -> list[Any]:
    """The alternatives of a Union / Optional / ``X | Y`` (Annotated unwrapped)."""
    origin = typing.get_origin(ann)
    if origin in _UNION:
        return [m for a in typing.get_args(ann) for m in _members(a)]
    if origin is typing.Annotated:
        return _members(typing.get_args(ann)[0])
    return [ann]


def _is_any(ann: Any) -> bool:
    """An annotation that says nothing checkable: missing, Any, object, or not resolvable at run time."""
    return ann is Any or ann is object or isinstance(ann, (str, typing.TypeVar, typing.ForwardRef))


def _callable_returns(ann: Any) -> Any:
    """R of ``Callable[..., R]`` (Any for a bare Callable), or None when `ann` is no Callable."""
    if ann is collections.abc.Callable or ann is typing.Callable:
        return Any
    if typing.get_origin(ann) is collections.abc.Callable:
        args = typing.get_args(ann)
        return args[-1] if args else Any
    return None


def _takes_callable(ann: Any) -> bool:
    return _is_any(ann) or _callable_returns(ann) is not None


def _builds(obj: Any, returns: Any) -> bool:
    """Does calling `obj` give a `returns` (by its class, or by a function's return annotation)?"""
    if inspect.isclass(obj):
        return any(_subclass(obj, r) for r in _members(returns))
    try:
        result = typing.get_type_hints(obj).get("return", Any)
    except Exception:
        return False
    return any(_subclass(r, want) for r in _members(result) for want in _members(returns))


def _subclass(obj: Any, ann: Any) -> bool:
    if _is_any(ann) or not inspect.isclass(obj):
        return False
    cls = typing.get_origin(ann) or ann
    try:
        return inspect.isclass(cls) and issubclass(obj, cls)
    except TypeError:  # a Protocol that is not runtime-checkable, say
        return False


def _defines_call(cls: type) -> bool:
    """Are the instances of `cls` callable (``__call__`` in its own MRO, not type's)?"""
    return any("__call__" in vars(k) for k in cls.__mro__ if k is not object)


def _kind(obj: Any) -> str:
    if inspect.isbuiltin(obj):
        return "builtin function"
    if inspect.isfunction(obj):
        return "function"
    if inspect.ismethod(obj):
        return "method"
    return f"{type(obj).__name__} object"


def describe(ann: Any) -> str:
    """A type as users write it: its shortest public import path (trainer.Task, not trainer.task.Task)."""
    if _is_any(ann):
        return "Any" if not isinstance(ann, str) else f"{ann!r}, which cannot be resolved at run time"
    if not inspect.isclass(ann):
        return str(ann).replace("typing.", "")
    if ann.__module__ == "builtins":
        return ann.__qualname__
    parts = ann.__module__.split(".")
    for i in range(1, len(parts) + 1):
        module = sys.modules.get(".".join(parts[:i]))
        if module is not None and getattr(module, ann.__qualname__, None) is ann:
            return f"{'.'.join(parts[:i])}.{ann.__qualname__}"
    return f"{ann.__module__}.{ann.__qualname__}"


def _code_of(obj: Any) -> Any:
    """The function whose module resolves the annotations of `obj`'s parameters."""
    if inspect.isclass(obj):
        for k in obj.__mro__:
            for name in ("__init__", "__new__"):
                if name in vars(k) and k is not object:
                    return inspect.unwrap(vars(k)[name])
        return None
    return inspect.unwrap(obj) if callable(obj) else None


def _evaluate(text: str, scope: dict[str, Any]) -> Any:
    try:
        return eval(text, dict(scope))  # the annotation as its module wrote it (PEP 563 strings)
    except Exception:
        return text  # unresolvable (a TYPE_CHECKING import): nothing to check against
