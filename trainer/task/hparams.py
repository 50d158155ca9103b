"""Hyperparameters: what `save_hyperparameters()` records for a Task or a DataModule (Lightning's rules)."""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from types import FrameType
from typing import Any


class AttributeDict(dict):
    """A dict whose keys are also attributes: ``hparams.lr``."""

    def __getattr__(self, key: str) -> Any:
        try:
            return self[key]
        except KeyError as e:
            raise AttributeError(f"no hyperparameter {key!r} (have: {sorted(self)})") from e

    def __setattr__(self, key: str, value: Any) -> None:
        self[key] = value


def init_arguments(frame: FrameType, owner: object) -> dict[str, Any]:
    """The arguments of the __init__ running in `frame` (a parent's too, when a subclass calls super()),
    without `self` and private names; **kwargs are included."""
    code = frame.f_code
    n_args = code.co_argcount + code.co_kwonlyargcount
    local = frame.f_locals
    args = {
        k: local[k]
        for k in code.co_varnames[:n_args]
        if k in local and local[k] is not owner and not k.startswith("_")
    }
    if code.co_flags & inspect.CO_VARKEYWORDS:
        var_kw = local.get(code.co_varnames[n_args + bool(code.co_flags & inspect.CO_VARARGS)])
        if isinstance(var_kw, Mapping):
            args.update(var_kw)
    return args


class HyperparametersMixin:
    """`save_hyperparameters()` and `hparams`, shared by Task and DataModule."""

    _hparams: AttributeDict
    _log_hyperparams: bool

    @property
    def hparams(self) -> AttributeDict:
        if "_hparams" not in self.__dict__:
            object.__setattr__(self, "_hparams", AttributeDict())
        return self.__dict__["_hparams"]

    def save_hyperparameters(
        self,
        *args: Any,
        ignore: Sequence[str] | str | None = None,
        frame: FrameType | None = None,
        logger: bool = True,
    ) -> None:
        """Record the calling __init__'s arguments in self.hparams (and in checkpoints).

        `args` may name the arguments to keep, or be one dict/Namespace-like object to record as is;
        `ignore` drops names; `logger=False` keeps them out of the loggers' hyperparameter tables.
        """
        if frame is None:
            current = inspect.currentframe()
            frame = current.f_back if current is not None else None
        if len(args) == 1 and not isinstance(args[0], str):
            given = args[0]
            values = dict(given) if isinstance(given, Mapping) else dict(vars(given))
        else:
            values = init_arguments(frame, self) if frame is not None else {}
            if args:
                values = {k: v for k, v in values.items() if k in args}
        ignored = {ignore} if isinstance(ignore, str) else set(ignore or ())
        self.hparams.update({k: v for k, v in values.items() if k not in ignored})
        object.__setattr__(self, "_log_hyperparams", logger)
