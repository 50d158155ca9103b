"""Which public names have no docstring: every name a public package exports (its ``__all__``) and every public
method and property of an exported class, its own docstring or the one it overrides (a hook keeps the base's).

`make docs` fails while this list is not empty (tools/docs_hooks.py); ``python tools/docstrings.py`` prints it.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

#: the packages whose exports form the public API (the API reference has a page for each)
PUBLIC = (
    "trainer",
    "trainer.loggers",
    "trainer.tuner",
    "trainer.utilities",
    "callbacks",
    "strategies",
    "strategies.accelerators",
    "trainer.plugins",
    "trainer.profilers",
)


def _doc_in_mro(cls: type, name: str) -> bool:
    for base in cls.__mro__:
        if name in vars(base):
            member = vars(base)[name]
            member = getattr(member, "__func__", member)  # staticmethod, classmethod
            if (getattr(member, "__doc__", None) or "").strip():
                return True
    return False


def _is_documentable(member: Any) -> bool:
    member = getattr(member, "__func__", member)
    return inspect.isfunction(member) or isinstance(member, property)


def undocumented(packages: tuple[str, ...] = PUBLIC) -> list[str]:
    """``package.Name`` or ``package.Name.member`` for each public name without a docstring."""
    missing = []
    for package in packages:
        try:
            module = importlib.import_module(package)
        except ModuleNotFoundError:
            continue  # a package this checkout does not have yet
        for name in getattr(module, "__all__", ()):
            obj = getattr(module, name)
            if (inspect.isclass(obj) or inspect.isfunction(obj)) and not (obj.__doc__ or "").strip():
                missing.append(f"{package}.{name}")
            if not inspect.isclass(obj):
                continue
            for attr in dir(obj):
                if attr.startswith("_"):
                    continue
                static = inspect.getattr_static(obj, attr)
                if _is_documentable(static) and not _doc_in_mro(obj, attr):
                    missing.append(f"{package}.{name}.{attr}")
    return missing


if __name__ == "__main__":
    names = undocumented()
    print("\n".join(names) or "every public name has a docstring")
    raise SystemExit(1 if names else 0)
