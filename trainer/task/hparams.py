"""Hyperparameters: what `save_hyperparameters()` records for a Task or a DataModule (Lightning's rules)."""

from __future__ import annotations

import contextlib
import contextvars
import copy
import dataclasses
import inspect
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from types import FrameType
from typing import Any

import torch

from tandem_core.rank_zero import rank_zero_warn

# Set while LightningCLI builds a task or DataModule: save_hyperparameters() records these (the config as
# the CLI parsed it, with "_instantiator"), so that load_from_checkpoint rebuilds nested classes from it.
_GIVEN: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "tandem_given_hparams", default=None
)


@contextlib.contextmanager
def given_hyperparameters(hparams: dict[str, Any], instantiator: str) -> Iterator[None]:
    """Within the block, save_hyperparameters() records `hparams` plus ``_instantiator``, not the call's
    arguments (LightningCLI's load_from_checkpoint support)."""
    token = _GIVEN.set({**hparams, "_instantiator": instantiator})
    try:
        yield
    finally:
        _GIVEN.reset(token)


class AttributeDict(dict):
    """A dict whose keys are also attributes: ``hparams.lr`` (Lightning's AttributeDict, public in
    trainer.utilities)."""

    def __getattr__(self, key: str) -> Any:
        try:
            return self[key]
        except KeyError as e:
            raise AttributeError(f"no hyperparameter {key!r} (have: {sorted(self)})") from e

    def __setattr__(self, key: str, value: Any) -> None:
        self[key] = value

    def __delattr__(self, key: str) -> None:
        del self[key]  # a KeyError for a missing key, as Lightning's

    def __repr__(self) -> str:
        """One '"key": value' line per key, sorted, the values aligned (Lightning's form)."""
        if not self:
            return ""
        width = max(len(str(k)) for k in self) + 3
        return "\n".join(f"{f'{chr(34)}{k}{chr(34)}:':{width}s} {self[k]}" for k in sorted(self))


def is_omegaconf(value: Any) -> bool:
    """An omegaconf DictConfig (told by its module: the Trainer layer never imports omegaconf itself)."""
    return type(value).__module__.split(".")[0] == "omegaconf" and isinstance(value, MutableMapping)


def plain_hparams(hparams: Any) -> tuple[dict[str, Any], str | None]:
    """What a checkpoint stores of `hparams`: plain data (a DictConfig as its container, interpolations
    resolved as Lightning saves them) and "DictConfig" when it was one, so that loading rebuilds it
    (trainer/checkpoint/format.py: rebuilt_form)."""
    if is_omegaconf(hparams):
        from omegaconf import OmegaConf

        return OmegaConf.to_container(hparams, resolve=True), "DictConfig"  # type: ignore[return-value]
    return dict(hparams), None


def _frozen_copy(values: AttributeDict) -> AttributeDict:
    """A deep copy (Lightning's), or a shallow one where a value cannot be deep-copied (a generator)."""
    try:
        return copy.deepcopy(values)
    except Exception:  # noqa: BLE001 (any copy failure: fall back rather than fail save_hyperparameters)
        return AttributeDict(values)


_NOT_HPARAMS = ("__class__", "frame", "frame_args")  # names Lightning leaves out as well


def _frame_arguments(frame: FrameType, cls: type) -> dict[str, Any]:
    """The values of `cls.__init__`'s parameters in `frame` (the __init__ of `cls` running), **kwargs merged,
    without self and *args."""
    params = list(inspect.signature(cls.__init__).parameters.values())  # type: ignore[misc]
    local = frame.f_locals
    skip = {params[0].name} if params else set()
    skip |= {p.name for p in params if p.kind is p.VAR_POSITIONAL}
    var_kw = next((p.name for p in params if p.kind is p.VAR_KEYWORD), None)
    args = {
        p.name: local[p.name] for p in params if p.name in local and p.name not in skip and p.name != var_kw
    }
    if var_kw is not None and isinstance(local.get(var_kw), Mapping):
        args.update(local[var_kw])
    return {k: v for k, v in args.items() if k not in _NOT_HPARAMS}


def init_arguments(frame: FrameType, mixin: type) -> dict[str, Any]:
    """The arguments of every __init__ of the super().__init__ chain that reached `frame`, as Lightning
    collects them: from `frame` outwards, each frame of an ``__init__`` that calls super() (so it has
    `__class__`) whose ``self`` is a `mixin` (a plain mixin class in the chain counts too), until the first frame
    that is not; a subclass's values win."""
    chain: list[dict[str, Any]] = []
    current: FrameType | None = frame
    while current is not None and current.f_back is not None:
        cls = current.f_locals.get("__class__")
        owner = _self_of(current, cls) if current.f_code.co_name == "__init__" else None
        if isinstance(cls, type) and isinstance(owner, mixin):
            chain.append(_frame_arguments(current, cls))
        elif chain:  # past the outermost __init__ of the chain
            break
        current = current.f_back
    values: dict[str, Any] = {}
    for args in chain:  # the innermost (the parent's) first: a child's value of the same name wins
        values.update(args)
    return values


def _self_of(frame: FrameType, cls: Any) -> Any:
    """The instance an ``__init__`` frame of `cls` builds (its first parameter, whatever its name)."""
    if not isinstance(cls, type):
        return None
    params = list(inspect.signature(cls.__init__).parameters)  # type: ignore[misc]
    return frame.f_locals.get(params[0]) if params else None


_PRIMITIVE_TYPES = (bool, int, float, str)


def _given_config(given: Any) -> None:
    """Lightning's check of `save_hyperparameters(config)`: a mapping, Namespace or omegaconf config."""
    from argparse import Namespace

    if isinstance(given, _PRIMITIVE_TYPES):
        raise ValueError(f"Primitives {_PRIMITIVE_TYPES} are not allowed.")
    if not isinstance(given, (Mapping, Namespace)) and not is_omegaconf(given):
        raise ValueError(f"Unsupported config type of {type(given)}.")


class HyperparametersMixin:
    """`save_hyperparameters()` and `hparams`, shared by Task and DataModule."""

    _hparams: AttributeDict
    _log_hyperparams: bool

    @property
    def hparams(self) -> AttributeDict:
        """The hyperparameters save_hyperparameters recorded (an attribute dict)."""
        if "_hparams" not in self.__dict__:
            object.__setattr__(self, "_hparams", AttributeDict())
        return self.__dict__["_hparams"]

    @property
    def hparams_initial(self) -> AttributeDict:
        """A copy of the hyperparameters as save_hyperparameters() recorded them (later edits not included)."""
        return _frozen_copy(self.__dict__.get("_hparams_initial", AttributeDict()))

    def remove_ignored_hparams(self, ignore_list: Sequence[str]) -> None:
        """Drop hyperparameters a parent class saved (a subclass's own `ignore`)."""
        for key in ignore_list:
            self.hparams.pop(key, None)

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
        from_cli = _GIVEN.get()
        if from_cli is not None:
            init = dict(from_cli)
        elif dataclasses.is_dataclass(self):  # a dataclass task: its fields taken by __init__ (Lightning's)
            init = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}
        else:
            init = init_arguments(frame, HyperparametersMixin) if frame is not None else {}
        object.__setattr__(self, "_log_hyperparams", logger)
        if len(args) == 1 and not isinstance(args[0], str) and not args[0]:
            return  # an empty container: nothing to record (Lightning's)
        objects = [a for a in args if not isinstance(a, str)]
        if len(objects) == 1:
            given = objects[
                0
            ]  # one object: its name among the __init__ arguments rebuilds it on load (Lightning's)
            _given_config(given)
            object.__setattr__(self, "_hparams_name", next((k for k, v in init.items() if v is given), None))
            if is_omegaconf(given):  # kept as the DictConfig itself, as Lightning keeps it
                object.__setattr__(self, "_hparams", given)
                object.__setattr__(self, "_hparams_initial", _frozen_copy(given))
                return
            values = dict(given) if isinstance(given, Mapping) else dict(vars(given))
        else:
            values = {k: v for k, v in init.items() if k in args} if args else init
            object.__setattr__(self, "_hparams_name", "kwargs" if values else None)
        if not isinstance(self.hparams, dict):  # a DictConfig saved before: replaced, as Lightning
            object.__setattr__(self, "_hparams", AttributeDict())
        ignored = {ignore} if isinstance(ignore, str) else set(ignore or ())
        self.hparams.update({k: v for k, v in values.items() if k not in ignored})
        self.remove_ignored_hparams(list(ignored))  # a subclass's ignore drops what its base class saved
        for key, value in self.hparams.items():
            if isinstance(value, torch.nn.Module):
                rank_zero_warn(
                    f"Attribute {key!r} is an instance of `nn.Module` and is already saved during checkpointing. "
                    f"It is recommended to ignore them using `self.save_hyperparameters(ignore=[{key!r}])`."
                )
        object.__setattr__(self, "_hparams_initial", _frozen_copy(self.hparams))
