"""Classify a failing Lightning test under the Tandem run:
- "internal": the test reads or patches a Lightning private: an underscored name, an object of one of Lightning's
  private classes (the loops `_FitLoop`..., their progress trackers and fetchers, the connectors, the result
  collection: reached through `trainer.fit_loop`, `trainer._checkpoint_connector`, ...), or a module Lightning does
  not export;
- "mocked": the test checks a public result, but only behind a mock of a Lightning internal that is not private
  by name (a function of a Lightning module such as `accelerators.cpu.get_cpu_stats`, or another library's name
  where a Lightning module looks it up); these are listed apart in docs/porting.md and looked at one by one;
- "behaviour": a public name, attribute or result differs (the target of issues 36 and 43).
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import inspect
import os
import re
from typing import Any

_INTERNAL_ATTR = re.compile(
    r"^_|_loop$|loop_|connector|progress$|_results$|^batch_progress|^epoch_loop|^fetcher"
)
_INTERNAL_LINE = re.compile(r"\._[a-z]\w*|\b\w*_loop\b|_connector\b|\bbatch_progress\b|\.fetcher\b")
_PATCH = re.compile(
    r"""(?:patch(?:\.object)?|monkeypatch\.setattr)\(\s*["'](lightning\.(?:pytorch|fabric)[\w.]*)["']"""
)
# `import lightning.pytorch.x as m; monkeypatch.setattr(m, "_RICH_AVAILABLE", False)` (or the module spelled out:
# `monkeypatch.setattr(lightning.pytorch.loops.fit_loop, "_request_dataloader", ...)`): a Lightning module's internal
_MONKEYPATCH_INTERNAL = re.compile(r"""monkeypatch\.setattr\(\s*([\w.]+)\s*,\s*["'](_\w+)["']""")
_IMPORT_AS = re.compile(r"import (lightning\.(?:pytorch|fabric)[\w.]*) as (\w+)")


@functools.cache
def public_names(package: str) -> frozenset[str]:
    """Lightning's exported names of `package` ("callbacks", "loggers", ... or "" for the top), from its __all__."""
    spec = importlib.util.find_spec("pytorch_lightning")
    if spec is None or not spec.submodule_search_locations:
        return frozenset()
    path = os.path.join(
        spec.submodule_search_locations[0], *package.split(".") if package else [], "__init__.py"
    )
    try:
        tree = ast.parse(open(path).read())
    except OSError:
        return frozenset()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in node.targets):
            try:
                return frozenset(ast.literal_eval(node.value))
            except ValueError:
                return frozenset()
    return frozenset()


_INTERNAL_MODULES = (
    "loops",
    "trainer.connectors",
    "overrides",
    "accelerators",
    "utilities.imports",
    "utilities.testing",
    "utilities.types",
    "utilities.signature_utils",
    "core.optimizer",
)


def _internal_module(parts: list[str]) -> bool:
    """Modules holding Lightning's machinery rather than user-facing names (or any underscored module)."""
    dotted = ".".join(parts)
    return any(p.startswith("_") for p in parts) or any(
        dotted == m or dotted.startswith(m + ".") for m in _INTERNAL_MODULES
    )


def is_public(module: str, name: str) -> bool:
    """Whether Lightning's `module.name` (module dotted as lightning.pytorch.x...) is a public Lightning name."""
    parts = module.split(".")
    package = parts[2] if len(parts) > 2 else ""
    return (
        len(parts) > 1
        and parts[1] == "pytorch"
        and not name.startswith("_")
        and (name in public_names(package) or not _internal_module(parts[2:]))
    )


def _import_failure(text: str) -> tuple[str, str] | None:
    m = re.search(r"cannot import name '(\w+)' from '(lightning\.(?:pytorch|fabric)[\w.]*)'", text)
    if m:
        name, module = m.groups()
        public = is_public(module, name)
        kind = "behaviour" if public else "internal"
        what = "public name missing" if public else "not a public Lightning name"
        return kind, f"{what}: {module}.{name}"
    m = re.search(r"No module named '(lightning\.(?:pytorch|fabric)[\w.]*)'", text)
    if m:
        return "internal", f"Lightning module with no public counterpart: {m.group(1)}"
    return None


def _attribute_failure(text: str) -> tuple[str, str] | None:
    m = (
        re.search(r"'?(\w+)'? object has no attribute '(\w+)'", text)
        or re.search(r"type object '(\w+)' has no attribute '(\w+)'", text)
        or re.search(
            r"<([\w.]+) object at \w+> does not have the attribute '(\w+)'", text
        )  # mock.patch.object
    )
    if not m:
        return None
    owner, attr = m.groups()
    if _INTERNAL_ATTR.search(attr):
        return "internal", f"internal attribute {owner}.{attr}"
    return "behaviour", f"missing attribute {owner}.{attr}"


def _absent_failure(text: str) -> tuple[str, str] | None:
    m = re.search(
        r"AbsentName: (public Lightning name Tandem lacks|Lightning internal [\w ]+): ([\w.]+)", text
    )
    if not m:
        return None
    public = m.group(1).startswith("public")
    name = ".".join(p for p in m.group(2).split(".") if p)
    return (
        ("behaviour", f"public name missing: {name}")
        if public
        else ("internal", f"uses Lightning internal {name}")
    )


def collection(text: str) -> tuple[str, str]:
    found = _absent_failure(text) or _import_failure(text)
    if found:
        return found
    last = [line for line in text.splitlines() if line.startswith("E ")]
    return "behaviour", "collection: " + (last[-1][1:].strip() if last else "error")[:160]


def failure(item: Any, excinfo: Any) -> tuple[str, str]:
    if excinfo is None:
        return "behaviour", "failed"
    exc = excinfo.value
    text = f"{type(exc).__name__}: {exc}"
    for e in _chain(exc):  # a stand-in of absent.py was used, maybe under another error raised from it
        if type(e).__name__ == "AbsentName":
            public, name = e.public, e.name
            return (
                ("behaviour", f"public name missing: {name}")
                if public
                else ("internal", f"uses Lightning internal {name}")
            )
    if isinstance(exc, ImportError):
        found = _import_failure(text)
        if found:
            return found
    source = _test_source(item)
    line = _failing_line(item, excinfo)
    if line and _reaches_private(line, source):
        return "internal", f"reaches internals: {' '.join(line.split())[:120]}"
    remote = _remote_line(item, exc)  # the statement of the test's file where a spawned worker failed
    if remote and _reaches_private(remote, _module_source(item)):
        return "internal", f"reaches internals (in a worker): {' '.join(remote.split())[:120]}"
    if isinstance(exc, AttributeError):
        found = _attribute_failure(text)
        if found:
            return found
    # `assert future.exception() is None`: the error the assertion reports came from reading a Lightning private
    if isinstance(exc, AssertionError):
        found = _attribute_failure(text)
        if found and found[0] == "internal":
            return "internal", f"reports an error reading a Lightning internal: {found[1]}"
    targets = _PATCH.findall(source)
    for target in targets:
        if any(p.startswith("_") for p in target.split(".")):
            return "internal", f"patches Lightning private {target}"
    lightning_modules = {alias: module for module, alias in _IMPORT_AS.findall(source)}
    for owner, attr in _MONKEYPATCH_INTERNAL.findall(source):
        if owner in lightning_modules:
            return "internal", f"patches Lightning private {lightning_modules[owner]}.{attr}"
        if re.fullmatch(r"lightning\.(?:pytorch|fabric)[\w.]*", owner):  # the module spelled out
            return "internal", f"patches Lightning private {owner}.{attr}"
    for target in targets:
        module, names = _split_target(target)
        if names and _foreign([*module.split("."), names[0]]):
            return "mocked", f"mocks another library's name where Lightning looks it up: {target}"
        if not names or is_public(module, names[0]):
            continue  # a public name: the alias patches Tandem's own object, so the result is comparable
        return "mocked", f"mocks Lightning internal {target}"
    first = text.splitlines()[0] if text else ""
    return "behaviour", first[:160]


# `x = obj._private` or `x = Mock(spec=_PrivateClass)`: x stands for a Lightning internal
_PRIVATE_ASSIGN = re.compile(r"^\s*(\w+)\s*=(?!=)[^\n]*?(?:\._[a-z]\w*|\b_[A-Z]\w*)[^\n]*$", re.M)


def _reaches_private(line: str, source: str) -> bool:
    """Whether the test's failing statement reaches a Lightning internal: an underscored attribute, a loop,
    connector or progress object, or a name the test bound to one (`iterator = loader._iterator`,
    `stateful = Mock(spec=_Stateful)`)."""
    if _INTERNAL_LINE.search(line):
        return True
    bound = set(_PRIVATE_ASSIGN.findall(source))
    return any(re.search(rf"\b{re.escape(name)}\b", line) for name in bound)


def _foreign(leaf: list[str]) -> bool:
    """Whether `lightning.pytorch.<module>.<Name>` is another library's object imported into a Lightning module
    (`core.datamodule.DataLoader`: torch's): patching it there depends on how Lightning's module is written.
    Read from the module's source (its imports), without importing Lightning into the Tandem run."""
    spec = importlib.util.find_spec(
        {"pytorch": "pytorch_lightning", "fabric": "lightning_fabric"}.get(leaf[1], "-")
    )
    if spec is None or not spec.submodule_search_locations:
        return False
    try:
        tree = ast.parse(open(os.path.join(spec.submodule_search_locations[0], *leaf[2:-1]) + ".py").read())
    except OSError:
        return False
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == leaf[-1] for a in node.names):
            return node.level == 0 and not (node.module or "").startswith(("lightning", "pytorch_lightning"))
    return False


def _split_target(target: str) -> tuple[str, list[str]]:
    """`lightning.pytorch.accelerators.cpu.get_cpu_stats` -> ("lightning.pytorch.accelerators.cpu",
    ["get_cpu_stats"]): the longest prefix that is a module of the installed Lightning, and the names below it."""
    parts = target.split(".")
    real = {"pytorch": "pytorch_lightning", "fabric": "lightning_fabric"}.get(
        parts[1] if len(parts) > 1 else ""
    )
    spec = importlib.util.find_spec(real) if real else None
    if spec is None or not spec.submodule_search_locations:
        return target, []
    root = spec.submodule_search_locations[0]
    n = 2
    while n < len(parts) and (
        os.path.isfile(os.path.join(root, *parts[2 : n + 1]) + ".py")
        or os.path.isdir(os.path.join(root, *parts[2 : n + 1]))
    ):
        n += 1
    return ".".join(parts[:n]), parts[n:]


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    while exc is not None and exc not in seen and len(seen) < 20:
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    return seen


def failure_of(exc: BaseException) -> tuple[str, str] | None:
    """The class and reason of a missing attribute `exc` (an AttributeError), or None when it names none."""
    return _attribute_failure(f"{type(exc).__name__}: {exc}")


def _remote_line(item: Any, exc: BaseException) -> str:
    """The last statement of the test's own file in a worker's traceback (a ddp_spawn worker's failure reaches
    the test as the worker's exception, caused by the worker's traceback text)."""
    path = str(getattr(item, "path", ""))
    for e in _chain(exc):
        text = getattr(e, "text", None)
        if isinstance(text, str) and path:
            found = re.findall(rf'File "{re.escape(path)}", line \d+, in \w+\n\s+(.+)', text)
            if found:
                return found[-1]
    return ""


def _module_source(item: Any) -> str:
    try:
        return inspect.getsource(inspect.getmodule(item.obj))
    except (TypeError, OSError, AttributeError):
        return ""


def _test_source(item: Any) -> str:
    try:
        return inspect.getsource(item.obj)
    except (TypeError, OSError, AttributeError):
        return ""


def _failing_line(item: Any, excinfo: Any) -> str:
    path = str(getattr(item, "path", ""))
    line = ""
    for entry in excinfo.traceback:
        if str(entry.path) == path:
            try:
                line = str(entry.statement)
            except Exception:
                line = ""
    return line
