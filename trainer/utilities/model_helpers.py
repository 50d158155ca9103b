"""`is_overridden` (Lightning's ``lightning.pytorch.utilities.model_helpers.is_overridden``): whether an object's
class replaces a method of its Tandem base class (Task, DataModule or Callback)."""

from __future__ import annotations

import functools
from typing import Any
from unittest import mock

from callbacks.base import Callback
from trainer.task.base import Task
from trainer.task.datamodule import DataModule


def _code(fn: Any) -> Any:
    fn = getattr(fn, "__wrapped__", fn)  # functools.wraps / @contextmanager
    if isinstance(fn, mock.Mock):  # Mock(wraps=method): the wrapped method
        fn = fn._mock_wraps
    elif isinstance(fn, functools.partial):
        fn = fn.func
    fn = getattr(fn, "__func__", fn)
    return getattr(fn, "__code__", None) if fn is not None else None


def is_overridden(method_name: str, instance: object | None = None, parent: type | None = None) -> bool:
    """True when `instance`'s `method_name` is not the one `parent` defines (default parent: Task, DataModule or
    Callback, whichever `instance` is); False for no instance or an instance without that attribute.
    Example::

        is_overridden("training_step", task)          # True for any task that defines training_step
    """
    if instance is None:
        return False
    if parent is None:
        parent = next((p for p in (Task, DataModule, Callback) if isinstance(instance, p)), None)
        if parent is None:
            raise ValueError(
                f"is_overridden: {type(instance).__name__} is not a Task, DataModule or Callback; pass `parent=`"
            )
    attr = getattr(instance, method_name, None)
    if attr is None:
        return False
    own = _code(attr)
    if own is None:
        return False
    base = getattr(parent, method_name, None)
    if base is None:
        raise ValueError(f"is_overridden: the parent {parent.__name__} has no method {method_name!r}")
    return own != _code(base)
