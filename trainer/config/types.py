"""What a ``_target_`` may name where it stands, checked BEFORE anything is called.

A slot (``task``, ``data``, ``callbacks``, ``logger``, ``trainer.strategy``) takes subclasses of its type; a
nested entry takes what the annotation of the parameter it fills says. Only classes are called to build a
value. Where the parameter is ``Callable[..., R]``, what is passed must be known to give an R: uncalled
(``_partial_: true``) a subclass of R or a function annotated ``-> R``, built a class whose ``__call__`` (a
Module's ``forward``) is annotated ``-> R``. A bare ``Callable`` takes only `KNOWN_CALLABLES`; a parameter
with no annotation takes nothing built and no partial. Example::

    check(os.system, "os.system", Task, False, "task")  # ConfigError: ... is a builtin function, not a ...
"""

from __future__ import annotations

import collections.abc
import inspect
import sys
import types
import typing
from typing import Any

from tandem_core.errors import ConfigError

_UNION = (typing.Union, types.UnionType)
_ITEMS = (list, tuple, set, frozenset, collections.abc.Sequence, collections.abc.Iterable)
_ITEMS += (collections.abc.MutableSequence, collections.abc.Set, collections.abc.Collection)
_VALUES = (dict, collections.abc.Mapping, collections.abc.MutableMapping)


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
    untyped = any(_is_any(m) for m in members) or not members
    if partial:
        for m in members:
            returns = _callable_returns(m)
            if returns is not None and (_known(obj) if _is_any(returns) else _builds(obj, returns)):
                return
        if untyped:
            raise ConfigError(
                f"{where}: _partial_: true passes {target!r} uncalled into a parameter with no type to check "
                f"it against ({describe(expected)}); annotate that parameter Callable[..., X] with the class "
                "X the callable must build"
            )
        bare = any(_is_any(_callable_returns(m)) for m in members if _callable_returns(m) is not None)
        allowed = f" (a bare Callable takes only {KNOWN_TEXT})" if bare else ""
        raise ConfigError(
            f"{where}: _partial_: true passes {target!r} uncalled, but {where} takes {wants}, not a callable "
            f"known to build one{allowed}; remove _partial_, name a class the slot takes, or annotate the "
            "parameter Callable[..., X] with the class X it builds"
        )
    if not inspect.isclass(obj):
        hint = "; to pass it uncalled add _partial_: true" if any(_takes_callable(m) for m in members) else ""
        raise ConfigError(
            f"{where}: _target_ {target!r} is a {_kind(obj)}, not a subclass of {wants}; a config builds "
            f"objects of the classes a slot takes and calls no functions{hint}"
        )
    for m in members:
        returns = _callable_returns(m)
        if _subclass(obj, m) or (returns is not None and _instances_build(obj, returns)):
            return
    if untyped:
        raise ConfigError(
            f"{where}: _target_ {target!r} fills a parameter with no type to check it against "
            f"({describe(expected)}); annotate that parameter with the class it takes"
        )
    if any(_takes_callable(m) for m in members):
        raise ConfigError(
            f"{where}: _target_ {target!r} is the class {describe(obj)}, whose instances are not known to "
            f"give what {where} takes ({wants}): its __call__ (a Module's forward) must be annotated to return "
            "it (a bare Callable takes only " + KNOWN_TEXT + "); or pass a class or function that builds it "
            "with _partial_: true"
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
    return _callable_returns(ann) is not None


# What a bare ``Callable`` (or ``Callable[..., Any]``) takes: functions of these modules, and (uncalled or
# built) subclasses of these classes. Each only computes on tensors or builds torch objects.
KNOWN_MODULES = ("torch.nn.functional", "torch.nn.init")
KNOWN_CLASSES = ("torch.nn.Module", "torch.optim.Optimizer", "torch.optim.lr_scheduler.LRScheduler")
KNOWN_TEXT = "functions of torch.nn.functional or torch.nn.init, or subclasses of " + ", ".join(KNOWN_CLASSES)


def _known(obj: Any) -> bool:
    """Is `obj` one of `KNOWN_MODULES`' functions or a subclass of one of `KNOWN_CLASSES`?"""
    if inspect.isclass(obj):
        import torch

        bases = (torch.nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler)
        return issubclass(obj, bases)
    name = getattr(obj, "__name__", None)
    return any(
        isinstance(name, str) and getattr(sys.modules.get(m), name, None) is obj for m in KNOWN_MODULES
    )


def _instances_build(cls: Any, returns: Any) -> bool:
    """Do the instances of class `cls`, called, give a `returns`: by the return annotation of their
    ``__call__`` (a Module's ``forward``); for Any, is `cls` a known class? Defining ``__call__`` is not enough."""
    if not inspect.isclass(cls):
        return False
    if _is_any(returns):
        return _known(cls)
    import torch

    method = getattr(cls, "forward" if issubclass(cls, torch.nn.Module) else "__call__", None)
    if method is None or not any("__call__" in vars(k) for k in cls.__mro__ if k is not object):
        return False
    try:
        result = typing.get_type_hints(method).get("return", Any)
    except Exception:
        return False
    return any(_subclass(r, want) for r in _members(result) for want in _members(returns))


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
    # a Callable annotation is no class to subclass: any class with __call__ "is" one (see _instances_build)
    if _is_any(ann) or not inspect.isclass(obj) or _callable_returns(ann) is not None:
        return False
    cls = typing.get_origin(ann) or ann
    try:
        return inspect.isclass(cls) and issubclass(obj, cls)
    except TypeError:  # a Protocol that is not runtime-checkable, say
        return False


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
