"""``_target_`` entries: import the object an import path names, and call it with the entry's arguments.

Example: ``instantiate({"_target_": "torch.optim.SGD", "_partial_": True, "lr": 0.1}, expected=Callable)``
is ``functools.partial(torch.optim.SGD, lr=0.1)``; ``_target_: os.system`` is refused, never called.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import pkgutil
from typing import Any

from tandem_core.errors import ConfigError, TandemError, did_you_mean
from trainer.config.types import annotations, check, narrow

TARGET, PARTIAL = "_target_", "_partial_"


def locate(path: Any, where: str = "_target_") -> Any:
    """Import ``pkg.module.Name`` (or ``pkg.module:Name``); a ConfigError names the path and what failed."""
    if not isinstance(path, str) or not all(p.isidentifier() for p in path.replace(":", ".").split(".")):
        raise ConfigError(f"{where}: {path!r} is not an import path such as examples.digits.DigitsTask")
    if ":" in path:
        module_name, _, rest = path.partition(":")
        parts, cut = [*module_name.split("."), *rest.split(".")], len(module_name.split("."))
        candidates = [cut]
    else:
        parts = path.split(".")
        candidates = list(range(len(parts), 0, -1))  # the longest prefix that is a module
    module, cut, name = None, 0, path
    for cut in candidates:
        name = ".".join(parts[:cut])
        try:
            module = importlib.import_module(name)
            break
        except ModuleNotFoundError as e:
            if e.name and (name == e.name or name.startswith(e.name + ".")):
                continue  # this prefix is no module: try a shorter one
            raise ConfigError(f"{where}: importing {name!r} for {path!r} failed: {e}") from e
        except Exception as e:
            raise ConfigError(
                f"{where}: importing {name!r} for {path!r} failed: {type(e).__name__}: {e}"
            ) from e
    if module is None:
        raise ConfigError(
            f"{where}: cannot import {path!r}: there is no module {name!r}. Check the spelling, and that the "
            "package is installed or in the current directory."
        )
    obj, owner = module, ".".join(parts[:cut])
    for attr in parts[cut:]:
        if not hasattr(obj, attr):
            choices = [n for n in dir(obj) if not n.startswith("_")]
            if hasattr(obj, "__path__"):  # a package: its submodules too
                choices += [m.name for m in pkgutil.iter_modules(obj.__path__)]
            raise ConfigError(
                f"{where}: cannot import {path!r}: {owner!r} has no {attr!r}{did_you_mean(attr, choices)}"
            )
        obj, owner = getattr(obj, attr), f"{owner}.{attr}"
    if not callable(obj):
        raise ConfigError(f"{where}: {path!r} is a {type(obj).__name__}, not a class or function")
    return obj


def params(obj: Any) -> list[inspect.Parameter] | None:
    """The parameters of `obj`'s signature, or None where it has none to check against (some builtins)."""
    try:
        return list(inspect.signature(obj).parameters.values())
    except (TypeError, ValueError):
        return None


def instantiate(
    node: Any, where: str = "config", *, expected: Any, inject: dict[str, Any] | None = None
) -> Any:
    """Build ``_target_`` entries (depth first); other mappings and lists are rebuilt, values kept.

    `expected` is the type `node` must build (a slot's class, or a parameter's annotation): a target is
    checked against it (trainer/config/types.py) before it is called. `inject` fills arguments the entry
    does not set and its target accepts.
    """
    if isinstance(node, list):
        return [instantiate(v, f"{where}[{i}]", expected=narrow(expected, i)) for i, v in enumerate(node)]
    if not isinstance(node, dict):
        return node
    if TARGET not in node:
        return {k: instantiate(v, f"{where}.{k}", expected=narrow(expected, str(k))) for k, v in node.items()}
    target, partial = node[TARGET], node.get(PARTIAL, False)
    obj = locate(target, f"{where}._target_")
    if not isinstance(partial, bool):
        raise ConfigError(f"{where}._partial_ must be true or false, got {partial!r}")
    check(obj, target, expected, partial, where)  # before anything is called: a refused target never runs
    named, rest = annotations(obj)
    kwargs = {
        k: instantiate(v, f"{where}.{k}", expected=named.get(k, rest))
        for k, v in node.items()
        if k not in (TARGET, PARTIAL)
    }
    kwargs = {**{k: v for k, v in (inject or {}).items() if k in named}, **kwargs}
    if partial:
        return functools.partial(obj, **kwargs)
    try:
        return obj(**kwargs)
    except TandemError as e:
        raise ConfigError(f"{where} ({target}): {e}") from e
    except Exception as e:
        raise ConfigError(f"{where}: building {target} failed: {type(e).__name__}: {e}") from e


def built(obj: Any, kind: type, where: str, kind_name: str) -> Any:
    """`obj` if it is a `kind`, else a ConfigError saying what `where` built instead."""
    if not isinstance(obj, kind):
        raise ConfigError(f"{where}: built a {type(obj).__name__}, which is not a {kind_name}")
    return obj
