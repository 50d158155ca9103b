"""Stand-ins for Lightning names Tandem has no counterpart for, so that one test reaching them fails, not its file.

A Lightning test file often imports an internal name at module level (``from lightning.fabric.utilities.cloud_io
import _load``) and uses it in a few tests only. Refusing the import would fail every test of the file and hide how
the others behave. Under the Tandem run the alias hands out an ``Absent`` stand-in instead: importing it works, any
USE of it (calling, instantiating a subclass, truth value, iteration, isinstance, arithmetic) raises
``AbsentName``, which the report classifies as "internal" or, for a public Lightning name Tandem lacks, as
"behaviour". Attribute access gives a further stand-in (``_Loop.run`` is absent too). Nothing here implements
Lightning behaviour: a stand-in can only fail.

Lightning's environment flags (``_TORCH_GREATER_EQUAL_2_6``, ``_RICH_AVAILABLE``, ...) are facts about the installed
packages, not behaviour; they resolve to the installed Lightning's own value, since tests use them in ``skipif``.
"""

from __future__ import annotations

import importlib
import re
from typing import Any, NoReturn

# `_RICH_AVAILABLE`, `_TORCH_GREATER_EQUAL_2_6`, `_TORCH_EQUAL_2_9`, `_IS_WINDOWS`, `_IS_INTERACTIVE`, ...
_FLAG = re.compile(
    r"^_(?:\w+_)?(?:AVAILABLE|(?:GREATER|LESS)_EQUAL_\w+|EQUAL_\d\w*|GE_\d\w*|IS_WINDOWS|IS_INTERACTIVE)$"
)
_REAL = {"pytorch": "pytorch_lightning", "fabric": "lightning_fabric"}


class AbsentName(BaseException):
    """A Lightning name with no Tandem counterpart was used. `public`: a name Lightning exports (a behaviour gap).
    A BaseException, so that neither a test's ``pytest.raises(Exception)`` nor an ``except Exception`` in the code
    under test swallows it."""

    def __init__(self, name: str, public: bool) -> None:
        self.name, self.public = name, public
        what = (
            "public Lightning name Tandem lacks"
            if public
            else "Lightning internal with no Tandem counterpart"
        )
        super().__init__(f"{what}: {name}")


class _AbsentMeta(type):
    def _fail(cls, *_: Any, **__: Any) -> NoReturn:
        raise AbsentName(cls._lightning_name, cls._public)

    def __getattr__(cls, attr: str) -> Any:
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return absent(f"{cls._lightning_name}.{attr}", cls._public)

    __call__ = __bool__ = __iter__ = __len__ = __instancecheck__ = __subclasscheck__ = _fail
    __eq__ = __lt__ = __le__ = __gt__ = __ge__ = __add__ = __radd__ = __getitem__ = __contains__ = _fail
    __enter__ = __exit__ = __int__ = __float__ = __index__ = _fail
    __hash__ = type.__hash__  # stand-ins are keys in mock's bookkeeping


def absent(name: str, public: bool) -> Any:
    """A stand-in for Lightning's `name` (dotted, as `lightning.pytorch....`) that fails on any use."""
    return _AbsentMeta(name.rsplit(".", 1)[-1], (), {"_lightning_name": name, "_public": public})


def flag_value(module: str, name: str) -> bool | None:
    """The installed Lightning's value of an environment flag `module.name`, or None when `name` is no flag."""
    if not _FLAG.match(name):
        return None
    parts = module.split(".")
    try:
        real = importlib.import_module(".".join([_REAL[parts[1]], *parts[2:]]))
        return bool(getattr(real, name))
    except (ImportError, AttributeError, KeyError, IndexError):
        return None
