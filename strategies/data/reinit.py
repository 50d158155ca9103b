"""Rebuilding a DataLoader of any class (PyG's, a user's subclass) with another sampler.

A plain `DataLoader` is rebuilt from its attributes (`rebuild`, below). A subclass has its
own `__init__`, so it is rebuilt by calling that `__init__` again: with the arguments it was built with when
it was made inside a `*_dataloader()` hook (recorded by `recording_init_args`), otherwise with the instance
attributes named like its parameters. When neither gives every argument, or the rebuilt loader does not use
the new sampler, a `LoaderError` names the class and says what to change: nothing is silently unsharded.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterator
from typing import Any

from torch.utils.data import DataLoader, IterableDataset, Sampler

from tandem_core.errors import TandemError

_RECORD = "_tandem_init_args"  # (args, kwargs) of the outermost __init__ call, set on the instance


def rebuildable(loader: Any) -> bool:
    """Only plain map-style DataLoaders can be rebuilt faithfully from their attributes."""
    return type(loader) is DataLoader and not isinstance(loader.dataset, IterableDataset)


def rebuild(loader: DataLoader, **overrides: Any) -> DataLoader:
    """A copy of `loader` with some DataLoader arguments replaced (sampler, batch_sampler, worker_init_fn)."""
    params = inspect.signature(DataLoader.__init__).parameters
    kwargs = {k: getattr(loader, k) for k in params if k not in ("self", "shuffle") and hasattr(loader, k)}
    if loader.batch_size is not None:  # its batch_sampler was built from sampler + batch_size: rebuild it
        kwargs.pop("batch_sampler", None)
    kwargs.update(overrides)
    if kwargs.get("batch_sampler") is not None:  # exclusive with batch_size, sampler and drop_last
        kwargs.update(batch_size=1, sampler=None, drop_last=False)
    if kwargs.get("num_workers", 0) == 0:
        kwargs.pop("prefetch_factor", None)
        kwargs["persistent_workers"] = False
    return DataLoader(**kwargs)


class LoaderError(TandemError):
    """A loader Tandem must change (to give each rank its shard) but cannot rebuild faithfully."""


def _subclasses(cls: type) -> Iterator[type]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def _recording(init: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(init)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> None:
        if _RECORD not in self.__dict__:  # the outermost call: the arguments that built this instance
            object.__setattr__(self, _RECORD, (args, dict(kwargs)))
        init(self, *args, **kwargs)

    return wrapper


@contextlib.contextmanager
def recording_init_args() -> Iterator[None]:
    """While open, every DataLoader (subclass) built remembers its __init__ arguments, so that it can be
    rebuilt with a distributed sampler later (Lightning records them around `*_dataloader()` too)."""
    patched: dict[type, Any] = {}
    for cls in (DataLoader, *_subclasses(DataLoader)):
        if "__init__" in cls.__dict__:
            patched[cls] = cls.__dict__["__init__"]
            cls.__init__ = _recording(patched[cls])  # type: ignore[method-assign]
    try:
        yield
    finally:
        for cls, init in patched.items():
            cls.__init__ = init  # type: ignore[method-assign]


def _fail(loader: DataLoader, problem: str, fix: str) -> LoaderError:
    name = type(loader).__name__
    return LoaderError(
        f"cannot give each process its shard of the data: {name} {problem}. Tandem rebuilds a DataLoader "
        f"subclass by calling {name}.__init__ again with a distributed sampler as `sampler`. Fix: {fix}; "
        "or shard the data yourself and pass Trainer(use_distributed_sampler=False)."
    )


_PASS_ON = "accept `sampler` (or **kwargs) in __init__ and pass it on to DataLoader.__init__"


def _init_kwargs(loader: DataLoader) -> tuple[tuple[Any, ...], dict[str, Any], dict[str, inspect.Parameter]]:
    """The positional and keyword arguments that rebuild `loader`, and the parameters its __init__ takes."""
    params = dict(inspect.signature(type(loader).__init__).parameters)
    params.pop("self", None)
    names = [n for n, p in params.items() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    variadic = any(p.kind is p.VAR_KEYWORD for p in params.values())
    if variadic:  # **kwargs: assume they reach DataLoader.__init__ (PyG's loaders do so)
        base = dict(inspect.signature(DataLoader.__init__).parameters)
        base.pop("self")
        params = {**base, **params}
    recorded = loader.__dict__.get(_RECORD)
    if recorded is not None:
        args, kwargs = recorded
        if any(p.kind is p.VAR_POSITIONAL for p in params.values()):
            return args, dict(kwargs), params  # *args: keep the call as it was
        return (), {**dict(zip(names, args)), **kwargs}, params
    # no record: the attributes named like parameters, where they differ from the parameter's default
    attrs = {k: v for k, v in vars(loader).items() if not k.startswith("_")}
    attrs["multiprocessing_context"] = loader.multiprocessing_context
    kwargs = {n: attrs[n] for n, p in params.items() if n in attrs and attrs[n] is not p.default}
    kwargs["dataset"] = loader.dataset
    return (), kwargs, params


def reinstantiate(
    loader: DataLoader, sampler: Sampler | None = None, batch_sampler: Any = None
) -> DataLoader:
    """A new loader of the same class and arguments, drawing from `sampler` (or `batch_sampler`)."""
    if type(loader) is DataLoader:
        if batch_sampler is not None:
            return rebuild(loader, batch_sampler=batch_sampler)
        return rebuild(loader, sampler=sampler)
    args, kwargs, params = _init_kwargs(loader)
    if batch_sampler is not None:  # exclusive with batch_size, shuffle, sampler and drop_last
        kwargs.update(sampler=None, shuffle=False, batch_sampler=batch_sampler, batch_size=1, drop_last=False)
    else:
        kwargs.update(sampler=sampler, shuffle=False, batch_sampler=None)
    named = {n for n, p in params.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    missing = sorted(
        n
        for n, p in params.items()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty and n not in kwargs
    )
    if missing and not args:
        raise _fail(
            loader,
            f"takes {missing} in __init__ but keeps no attribute of that name",
            "build it inside train_dataloader()/val_dataloader()/... (its arguments are recorded there), "
            "or keep each __init__ argument as an attribute of the same name",
        )
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        # an __init__ without `sampler`, `shuffle`, `batch_sampler` cannot take the new sampler
        unknown = sorted(k for k in kwargs if k not in named)
        if unknown:
            raise _fail(loader, f"has no __init__ parameter (and no **kwargs) for {unknown}", _PASS_ON)
    try:
        new = type(loader)(*args, **kwargs)
    except TypeError as e:
        raise _fail(loader, f"could not be rebuilt ({e})", _PASS_ON) from e
    used = new.batch_sampler if batch_sampler is not None else new.sampler
    if used is not (batch_sampler if batch_sampler is not None else sampler):
        raise _fail(loader, "was rebuilt but does not use the sampler it was given", _PASS_ON)
    return new


def rebatch(batch_sampler: Any, sampler: Sampler) -> Any:
    """A custom batch sampler of the same class over `sampler`, when it looks like torch's BatchSampler
    (takes `sampler, batch_size, drop_last`); None when it cannot be rebuilt."""
    if not (hasattr(batch_sampler, "batch_size") and hasattr(batch_sampler, "drop_last")):
        return None
    try:
        new = type(batch_sampler)(
            sampler, batch_size=batch_sampler.batch_size, drop_last=batch_sampler.drop_last
        )
    except TypeError:
        return None
    return new if getattr(new, "sampler", None) is sampler else None  # one that ignored it: refused
