"""Lightning's ``lightning.pytorch.utilities.parsing``: where a task's value lives (``lightning_hasattr`` /
``lightning_getattr`` / ``lightning_setattr``: the task, its hparams, the datamodule, the datamodule's hparams, as the
Tuner looks them up) and the helpers of ``save_hyperparameters`` (``collect_init_args``, ``parse_class_init_keys``,
``clean_namespace``)."""

from __future__ import annotations

import inspect
import types
import warnings
from collections.abc import Mapping, MutableMapping
from typing import Any

from callbacks.finders import attrs
from trainer.utilities.data import is_picklable


def _missing(attribute: str) -> AttributeError:
    return AttributeError(
        f"{attribute} is neither stored in the model namespace nor the `hparams` namespace/dict, nor the "
        "datamodule."
    )


def lightning_hasattr(model: Any, attribute: str) -> bool:
    """Whether `attribute` is an attribute or hyperparameter of the task, or of the Trainer's datamodule."""
    return attrs.has(model, attribute)


def lightning_getattr(model: Any, attribute: str) -> Any:
    """The value of `attribute` from the last of its holders (the datamodule's wins, as in Lightning); an
    AttributeError when none holds it."""
    if not attrs.has(model, attribute):
        raise _missing(attribute)
    return attrs.get(model, attribute)


def lightning_setattr(model: Any, attribute: str, value: Any) -> None:
    """Set `attribute` in every holder (so that whatever reads it sees the new value); an AttributeError when
    none holds it."""
    if not attrs.has(model, attribute):
        raise _missing(attribute)
    attrs.set_everywhere(model, attribute, value)


def clean_namespace(hparams: MutableMapping[str, Any]) -> None:
    """Remove the values that cannot be pickled from `hparams`, with a warning naming each."""
    for key in [k for k, v in hparams.items() if not is_picklable(v)]:
        warnings.warn(
            f"Attribute '{key}' removed from hparams because it cannot be pickled. You can suppress this warning "
            f"by setting `self.save_hyperparameters(ignore=['{key}'])`.",
            UserWarning,
            stacklevel=2,
        )
        del hparams[key]


def parse_class_init_keys(cls: type) -> tuple[str, str | None, str | None]:
    """The names of `cls.__init__`'s self, ``*args`` and ``**kwargs`` parameters (None where there is none)."""
    params = list(inspect.signature(cls.__init__).parameters.values())  # type: ignore[misc]
    var_pos = next((p.name for p in params if p.kind is p.VAR_POSITIONAL), None)
    var_kw = next((p.name for p in params if p.kind is p.VAR_KEYWORD), None)
    return params[0].name, var_pos, var_kw


def get_init_args(frame: types.FrameType) -> dict[str, Any]:
    """The arguments of the ``__init__`` running in `frame` (``**kwargs`` merged, without self and ``*args``);
    ``{}`` when `frame` is no ``__init__`` of a class that calls ``super()``."""
    return _init_args(frame)[1]


def _init_args(frame: types.FrameType) -> tuple[Any, dict[str, Any]]:
    local = frame.f_locals
    cls = local.get("__class__")
    if cls is None or frame.f_code.co_name != "__init__":
        return None, {}
    names = inspect.signature(cls.__init__).parameters  # type: ignore[misc]
    self_name, args_name, kwargs_name = parse_class_init_keys(cls)
    values = {k: local[k] for k in names if k in local}
    if kwargs_name and isinstance(values.get(kwargs_name), Mapping):
        values.update(values[kwargs_name])
    skip = {n for n in (self_name, args_name, kwargs_name) if n} | {"__class__", "frame", "frame_args"}
    return local.get(self_name), {k: v for k, v in values.items() if k not in skip}


def collect_init_args(
    frame: types.FrameType,
    path_args: list[dict[str, Any]],
    inside: bool = False,
    classes: tuple[type, ...] = (),
) -> list[dict[str, Any]]:
    """The arguments of each ``__init__`` of the ``super().__init__`` chain that reached `frame`, appended to
    `path_args` from the innermost (the base class's) to the outermost (the most derived class's); with
    `classes`, only the frames whose ``self`` is one of them."""
    current: types.FrameType | None = frame
    while current is not None and isinstance(current.f_back, types.FrameType):
        owner, args = _init_args(current)
        if "__class__" in current.f_locals and (not classes or isinstance(owner, classes)):
            path_args.append(args)
            inside = True
        elif inside:
            break
        current = current.f_back
    return path_args
