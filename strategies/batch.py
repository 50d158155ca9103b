"""Walking nested batches: tuples, lists, dicts, dataclasses and namedtuples of tensors."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import torch

_Tensor = torch.Tensor
_CPU = torch.device("cpu")


def apply_to_tensors(
    data: Any, fn: Callable[[torch.Tensor], Any], other: Callable[[Any], Any] | None = None
) -> Any:
    """Return `data` with `fn` applied to every tensor inside it, keeping the container types (and `other`, when
    given, to every other value that is not a container)."""
    if isinstance(data, torch.Tensor):
        return fn(data)
    kind = type(data)
    if kind is tuple or kind is list:  # the common batch, (x, y): no recursion for its tensors
        return kind([fn(x) if isinstance(x, torch.Tensor) else apply_to_tensors(x, fn, other) for x in data])
    if isinstance(data, tuple) and hasattr(data, "_fields"):  # namedtuple
        return type(data)(*(apply_to_tensors(x, fn, other) for x in data))
    if isinstance(data, (list, tuple)):
        return type(data)(apply_to_tensors(x, fn, other) for x in data)
    if isinstance(data, Mapping):
        return type(data)({k: apply_to_tensors(v, fn, other) for k, v in data.items()})
    if dataclasses.is_dataclass(data) and not isinstance(data, type):
        changes = {
            f.name: apply_to_tensors(getattr(data, f.name), fn, other)
            for f in dataclasses.fields(data)
            if f.init
        }
        return dataclasses.replace(data, **changes)
    return data if other is None else other(data)


def first_tensor(data: Any) -> torch.Tensor | None:
    """The first tensor found in a nested batch, or None."""
    if isinstance(data, torch.Tensor):
        return data
    if isinstance(data, Mapping):
        data = list(data.values())
    elif dataclasses.is_dataclass(data) and not isinstance(data, type):
        data = [getattr(data, f.name) for f in dataclasses.fields(data)]
    if isinstance(data, (list, tuple)):
        for item in data:
            found = first_tensor(item)
            if found is not None:
                return found
    return None


def batch_size_of(batch: Any) -> int:
    """Length along dim 0 of the first tensor in the batch (1 when there is none)."""
    t = first_tensor(batch)
    return int(t.shape[0]) if t is not None and t.ndim > 0 else 1


def move_to_device(batch: Any, device: torch.device, dtype: torch.dtype | None = None) -> Any:
    """Move every tensor to `device`; floating tensors are cast to `dtype` when given (precision "64")."""
    return mover(device, dtype)(batch)


def mover(device: torch.device, dtype: torch.dtype | None = None) -> Callable[[Any], Any]:
    """`move(batch)`: move_to_device with `device` and `dtype` fixed, for a loop's every batch. A tuple or
    list of tensors that are all on `device` already (with no dtype to cast to) is returned as it is."""

    def move_one(t: torch.Tensor) -> torch.Tensor:
        if t.device == device and (dtype is None or not t.is_floating_point() or t.dtype == dtype):
            return t  # already there: skip .to(), which costs microseconds per call on the hot path
        if dtype is not None and t.is_floating_point():
            return t.to(device=device, dtype=dtype, non_blocking=True)
        return t.to(device, non_blocking=True)

    def move(batch: Any) -> Any:
        return apply_to_tensors(batch, move_one)

    if dtype is not None:
        return move
    cpu = device == _CPU

    def move_plain(batch: Any) -> Any:
        kind = type(batch)
        if kind is tuple or kind is list:  # the common batch, (x, y): returned as it is when already there
            for x in batch:
                # is_cpu reads a flag; .device builds a device object (the check runs for every batch)
                if type(x) is not _Tensor or (not x.is_cpu if cpu else x.device != device):
                    break
            else:
                return batch
        return apply_to_tensors(batch, move_one)

    return move_plain


def is_metric(value: Any) -> bool:
    """A torchmetrics Metric, detected without importing torchmetrics (it is slow to import)."""
    return hasattr(value, "compute") and hasattr(value, "reset") and hasattr(value, "update")
