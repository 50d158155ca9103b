"""What a checkpoint file may hold: plain data that `torch.load(weights_only=True)` reads without running
code. Hyperparameters that are not plain data (a `functools.partial` of an optimizer class, a class) are
stored as import paths in the config layer's `_target_` form and rebuilt, never called, on load, and only
into what the task's signature declares for them (the config's rule); anything else stays plain data.
Example: ``optimizer: Callable[..., Optimizer]`` gets ``partial(Adam, lr=0.01)`` back; ``optimizer: Any`` is a
CheckpointError at load time naming it and both fixes (annotate the parameter, or load a trusted file with
``weights_only=False``, which rebuilds every hyperparameter as it was saved); never a dict into ``__init__``.
An omegaconf DictConfig/ListConfig value is stored as its container (interpolations as their text) and comes
back as one (OmegaConf.create, which runs no code), as Lightning's pickled one does. Any other value (an
``nn.Module``, an object) is stored as pickled bytes beside its description: plain data to torch.load, unpickled
only by ``load_from_checkpoint(..., weights_only=False)`` (a file you trust: Lightning's result), and never when
the bytes would hold a recorded secret in clear."""

from __future__ import annotations

import functools
import pickle
import re
import sys
from types import UnionType as _UnionType
from typing import Any

import torch

from tandem_core.errors import CheckpointError

TARGET, PARTIAL, ARGS, NOT_SAVED, BARE = "_target_", "_partial_", "_args_", "_not_saved_", "_bare_"
PICKLED = "_pickled_"  # beside NOT_SAVED: the value's pickle, read only from a trusted file
OMEGACONF = "_omegaconf_"  # an omegaconf DictConfig/ListConfig value: its container (interpolations as text)
_PLAIN = (type(None), bool, int, float, str, torch.Tensor, torch.dtype, torch.device, torch.Size)


def encode(value: Any, where: str = "hparams") -> Any:
    """`value` as plain data: containers and scalars as they are, partials and classes as `_target_` dicts."""
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, (list, tuple)):
        return type(value)(encode(v, f"{where}[{i}]") for i, v in enumerate(value))
    if isinstance(value, dict):
        return {k: encode(v, f"{where}.{k}") for k, v in value.items()}
    if type(value).__module__.split(".")[0] == "omegaconf" and hasattr(value, "_get_node"):
        from omegaconf import OmegaConf  # (imported already: the value is one of its containers)

        return {OMEGACONF: encode(OmegaConf.to_container(value, resolve=False), where)}
    if isinstance(value, functools.partial):
        out = {TARGET: _path(value.func, where), PARTIAL: True}
        if value.args:
            out[ARGS] = [encode(a, where) for a in value.args]
        out.update({k: encode(v, f"{where}.{k}") for k, v in value.keywords.items()})
        return out
    if isinstance(value, type) or callable(value) and hasattr(value, "__qualname__"):
        return {TARGET: _path(value, where), PARTIAL: True, BARE: True}  # the object itself, not a partial
    out: dict[str, Any] = {
        NOT_SAVED: f"{type(value).__name__} (not plain data: pass it to load_from_checkpoint by name, or load a file "
        "you trust with weights_only=False)"
    }
    try:
        blob = pickle.dumps(value)
    except Exception:  # noqa: BLE001 (anything unpicklable is only described)
        return out
    from trainer.secrets import recorded

    if not any(secret and secret.encode() in blob for secret in recorded()):  # keys: the values found
        out[PICKLED] = blob
    return out


def missing(hparams: dict[str, Any], trust: bool = False) -> dict[str, str]:
    """The top-level hyperparameters that were not plain data and so cannot be given back: name -> what they were
    (with `trust`, those stored pickled come back)."""
    return {
        k: v[NOT_SAVED]
        for k, v in hparams.items()
        if isinstance(v, dict) and NOT_SAVED in v and not (trust and PICKLED in v)
    }


def without_pickles(value: Any) -> Any:
    """`value` (an encoded hyperparameter) without its pickled bytes: what two encodings compare on."""
    if isinstance(value, dict):
        return {k: without_pickles(v) for k, v in value.items() if k != PICKLED}
    if isinstance(value, (list, tuple)):
        return type(value)(without_pickles(v) for v in value)
    return value


def _path(obj: Any, where: str) -> str:
    path = f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', '')}"
    if "<" in path or path.startswith("."):
        raise CheckpointError(
            f"{where} holds {obj!r}, which has no import path; use a module-level class or function."
        )
    return path


def decode_for(cls: type, hparams: dict[str, Any], path: str, trust: bool = False) -> dict[str, Any]:
    """`hparams` rebuilt for ``cls(**hparams)``: each ``_target_`` dict only into what the annotation of the
    parameter it fills declares (the config's rule, trainer/config/types.py), else a CheckpointError; with
    `trust` (load_from_checkpoint(weights_only=False)) every one as it was saved."""
    from trainer.config.types import annotations

    named, rest = annotations(cls)
    return {
        k: decode(v, named.get(k, rest), f"hyper_parameters.{k}", path, trust) for k, v in hparams.items()
    }


def decode(
    value: Any, expected: Any = Any, where: str = "hyper_parameters", path: str = "", trust: bool = False
) -> Any:
    """Rebuild what `encode` wrote, checked against `expected` (the annotation of the parameter it fills):
    a `_target_` dict becomes a functools.partial (the class or function itself where that is what was saved,
    or for a ``type[X]`` parameter) only where that annotation takes it; nothing is called. One it refuses is
    a CheckpointError; with `trust` none is refused."""
    from trainer.config.types import narrow

    if isinstance(value, (list, tuple)):
        items = [decode(v, narrow(expected, i), f"{where}[{i}]", path, trust) for i, v in enumerate(value)]
        return items if isinstance(value, list) else tuple(items)
    if not isinstance(value, dict):
        return value
    if trust and NOT_SAVED in value and isinstance(value.get(PICKLED), bytes):
        return pickle.loads(value[PICKLED])  # a trusted file: the object as saved (Lightning's pickle)
    if value.get(PARTIAL) is True and isinstance(value.get(TARGET), str):
        return _rebuild(value, expected, where, path, trust)
    if value.keys() == {OMEGACONF}:  # plain data again in omegaconf's container (no code runs)
        from omegaconf import OmegaConf

        if not trust and _resolver_call(value[OMEGACONF]):
            raise CheckpointError(
                f"{path}: {where} holds an omegaconf resolver call ({_resolver_call(value[OMEGACONF])!r}), which "
                "would run when the value is read (${oc.env:...} reads the environment, other resolvers run code "
                "they were registered with). Load a file you trust with load_from_checkpoint(..., "
                "weights_only=False), or save the hyperparameters resolved."
            )
        return OmegaConf.create(value[OMEGACONF])
    return {k: decode(v, narrow(expected, str(k)), f"{where}.{k}", path, trust) for k, v in value.items()}


_RESOLVER = re.compile(r"\$\{\s*[\w.\-]+\s*:")  # ${name:...}: a resolver; ${a.b} only names another value


def _resolver_call(value: Any) -> str | None:
    """The first string in `value` (a config's container) that calls an omegaconf resolver, or None."""
    if isinstance(value, str):
        return value if _RESOLVER.search(value) else None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, v in items:
        found = _resolver_call(k) or _resolver_call(v)
        if found:
            return found
    return None


def _rebuild(value: dict[str, Any], expected: Any, where: str, path: str, trust: bool) -> Any:
    from tandem_core.errors import ConfigError
    from trainer.config.types import annotations, check, describe

    target = value[TARGET]
    bare = value.get(BARE) is True or value.keys() <= {TARGET, PARTIAL}  # (older files: no BARE marker)
    try:
        obj = resolve_loaded(target)
        kind = _class_of(expected)
        if trust and value.get(BARE) is True:
            return obj  # as saved: the class or function itself
        if kind is not None and isinstance(obj, type) and issubclass(obj, kind) and bare:
            return obj  # a type[X] parameter: the class itself
        if not trust:
            check(obj, target, expected, True, where)
    except (ConfigError, AttributeError) as e:
        reason = str(e) if isinstance(e, ConfigError) else f"{target!r} does not exist ({e})"
        raise CheckpointError(
            f"checkpoint {path!r}: {where} cannot be rebuilt: {reason}. A checkpoint's hyperparameters are "
            f"rebuilt only into what the task's signature declares ({describe(expected)} here). Either annotate "
            "the parameter with what it holds (e.g. `Callable[..., Optimizer]` for a partial of an optimizer "
            "class, `type[nn.Module]` for a class), or, for a checkpoint you trust, load it with "
            "weights_only=False (every hyperparameter comes back as saved); or pass the value to "
            "load_from_checkpoint by name."
        ) from None
    named, rest = annotations(obj)
    args = [decode(a, Any, f"{where}._args_[{i}]", path, trust) for i, a in enumerate(value.get(ARGS, []))]
    kwargs = {
        k: decode(v, named.get(k, rest), f"{where}.{k}", path, trust)
        for k, v in value.items()
        if k not in (TARGET, PARTIAL, ARGS, BARE)
    }
    return functools.partial(obj, *args, **kwargs)


def _class_of(expected: Any) -> type | None:
    """X of a ``type[X]`` annotation (or of a ``type[X] | None``), else None."""
    import typing

    for m in (
        typing.get_args(expected) if typing.get_origin(expected) in (typing.Union, _UnionType) else [expected]
    ):
        if typing.get_origin(m) is type and typing.get_args(m) and isinstance(typing.get_args(m)[0], type):
            return typing.get_args(m)[0]
    return None


def resolve_loaded(path: str) -> Any:
    """The object at `path` in a module that is already imported: a checkpoint never imports new code."""
    module_name, _, name = path.rpartition(".")
    while module_name and module_name not in sys.modules:
        module_name, _, head = module_name.rpartition(".")
        name = f"{head}.{name}"
    if not module_name:
        raise CheckpointError(
            f"the checkpoint's hyperparameters name {path!r}, whose module is not imported; import it yourself "
            "first (a checkpoint never imports modules), or pass the value to load_from_checkpoint."
        )
    obj: Any = sys.modules[module_name]
    for part in name.split("."):
        obj = getattr(obj, part)  # AttributeError: the caller keeps the value as plain data
    return obj


def rebuilt_form(cls: type, ckpt: dict[str, Any], kwargs: dict[str, Any], prefix: str) -> dict[str, Any]:
    """The keyword arguments `cls(...)` is rebuilt with, as Lightning: the hyperparameters a DictConfig again
    where they were one (rebuilt from plain data by OmegaConf.create, which runs no code), and all given to
    the one __init__ argument that took them as one object (`hparams_name`), else spread as keywords."""
    import inspect

    values: Any = kwargs
    if ckpt.get(f"{prefix}hparams_type") == "DictConfig":
        try:
            from omegaconf import OmegaConf
        except ImportError:
            raise CheckpointError(
                "this checkpoint's hyperparameters were an omegaconf DictConfig: install omegaconf to load it"
            ) from None
        values = OmegaConf.create(kwargs)
    name = ckpt.get(f"{prefix}hparams_name")
    if isinstance(name, str) and name != "kwargs" and name in inspect.signature(cls.__init__).parameters:
        return {name: values}
    return dict(kwargs) if values is kwargs else {str(k): values[k] for k in values}
