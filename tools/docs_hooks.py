"""mkdocs hooks (mkdocs.yml): the build fails on a public name without a docstring (tools/docstrings.py)."""

from __future__ import annotations

import os
import sys
from typing import Any

from mkdocs.exceptions import PluginError

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from docstrings import undocumented  # noqa: E402


def on_pre_build(config: Any, **kwargs: Any) -> None:
    missing = undocumented()
    if missing:
        raise PluginError(
            f"{len(missing)} public name(s) without a docstring (add one, or leave the name out of __all__): "
            + ", ".join(missing)
        )


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    """A line ``<!-- api: PACKAGE -->`` becomes one mkdocstrings entry per name PACKAGE exports (its __all__):
    the reference always lists exactly what the package exports, lazily imported names included."""
    import importlib

    out = []
    for line in markdown.splitlines():
        stripped = line.strip()
        if stripped.startswith("<!-- api:") and stripped.endswith("-->"):
            package = stripped[len("<!-- api:") : -len("-->")].strip()
            module = importlib.import_module(package)
            for name in module.__all__:
                out += [f"::: {_where(module, package, name)}", "", ""]
        else:
            out.append(line)
    return "\n".join(out)


def _where(module: Any, package: str, name: str) -> str:
    """Where `package.name` is defined: a lazily exported name is not in the package's namespace."""
    obj = getattr(module, name)
    home = sys.modules.get(getattr(obj, "__module__", "") or "")
    if hasattr(obj, "__qualname__"):
        return f"{obj.__module__}.{obj.__qualname__}"
    if home is not None and getattr(home, name, None) is obj:  # an instance (rank_zero_only)
        return f"{home.__name__}.{name}"
    return f"{package}.{name}"
