"""Small data helpers of Lightning's: move_data_to_device, suggested_max_num_workers, is_picklable,
has_len_all_ranks, extract_batch_size (with its once-per-message ``warning_cache``)."""

from __future__ import annotations

import dataclasses
import os
import pickle
import warnings
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch

from strategies.batch import apply_to_tensors
from tandem_core.errors import ConfigError


def move_data_to_device(batch: Any, device: torch.device | str | int) -> Any:
    """`batch` (a tensor, or a nested collection of tensors and objects with a ``to(device)`` method) on `device`;
    other values are left as they are."""
    if isinstance(device, str):
        device = torch.device(device)
    blocking = not isinstance(device, torch.device) or device.type in ("cpu", "mps")

    def to(data: Any) -> Any:
        out = (
            data.to(device)
            if blocking or not isinstance(data, torch.Tensor)
            else data.to(device, non_blocking=True)
        )
        return data if out is None else out  # a custom .to() that forgot to return self

    return apply_to_tensors(batch, to, other=lambda x: to(x) if callable(getattr(x, "to", None)) else x)


def suggested_max_num_workers(local_world_size: int) -> int:
    """An upper bound for DataLoader(num_workers=...): the CPUs this process may use, shared among the
    `local_world_size` processes of this machine, less one for each main process (at least 1)."""
    if local_world_size < 1:
        raise ValueError(f"`local_world_size` should be >= 1, got {local_world_size}.")
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cpus // local_world_size - 1)


def is_picklable(obj: object) -> bool:
    """Whether `obj` can be pickled."""
    try:
        pickle.dumps(obj)
    except (pickle.PickleError, AttributeError, RuntimeError, TypeError):
        return False
    return True


def has_len_all_ranks(
    dataloader: object, strategy: Any, allow_zero_length_dataloader_with_multiple_devices: bool = False
) -> bool:
    """Whether `dataloader` has a length (on every rank: the lengths are summed over the strategy's ranks, a
    collective every rank must call). A total of zero warns; a rank of length zero while others have batches is
    a RuntimeError unless `allow_zero_length_dataloader_with_multiple_devices` (then it warns)."""
    try:
        local = len(dataloader)  # type: ignore[arg-type]
    except (TypeError, NotImplementedError):
        return False
    name = type(dataloader).__name__
    total = int(strategy.comm.reduce(torch.tensor(local, device=strategy.root_device), op="sum"))
    if total == 0:
        warnings.warn(f"Total length of `{name}` across ranks is zero; is that what you meant?", stacklevel=2)
    elif local == 0:
        if not allow_zero_length_dataloader_with_multiple_devices:
            raise RuntimeError(
                f"`{name}` has zero length on this rank while others have batches: give every rank at least one "
                "batch (or allow_zero_length_dataloader_with_multiple_devices=True)"
            )
        warnings.warn(f"`{name}` has zero length on this rank while others have batches", stacklevel=2)
    dataset = getattr(dataloader, "dataset", None)
    if isinstance(dataset, torch.utils.data.IterableDataset):
        warnings.warn(
            "Your IterableDataset defines __len__: with several loader workers it is only right when each "
            "worker reads its own part of the data",
            stacklevel=2,
        )
    return True


class WarningCache(set):
    """Warns each distinct message once (Lightning's ``warning_cache``); ``clear()`` forgets them."""

    def warn(self, message: str, stacklevel: int = 5, category: type[Warning] = UserWarning) -> None:
        if message not in self:
            self.add(message)
            warnings.warn(message, category, stacklevel=stacklevel)


warning_cache = WarningCache()


def _sizes(batch: Any) -> Iterator[int | None]:
    """The dim-0 length of each leaf of `batch` (1 for a 0-dim tensor, None for a leaf that is no tensor)."""
    if isinstance(batch, torch.Tensor):
        yield batch.size(0) if batch.ndim else 1
    elif isinstance(batch, (Iterable, Mapping)) and not isinstance(batch, str):
        for item in batch.values() if isinstance(batch, Mapping) else batch:
            yield from _sizes(item)
    elif dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        for field in dataclasses.fields(batch):
            yield from _sizes(getattr(batch, field.name))
    else:
        yield None


def extract_batch_size(batch: Any) -> int:
    """The batch size of `batch`: the dim-0 length of its first tensor (a nested dict, list, tuple or dataclass is
    searched in order); a UserWarning when its leaves disagree, a ConfigError when it holds no tensor. As Lightning's
    (``self.log`` infers the size the same way: pass ``batch_size=`` where it cannot)."""
    message = (
        "We could not infer the batch_size from the batch. Either simplify its structure or provide the batch_size "
        "as `self.log(..., batch_size=batch_size)`."
    )
    found: int | None = None
    try:
        for size in _sizes(batch):
            if found is None:
                found = size
            elif found != size:
                warning_cache.warn(
                    "Trying to infer the `batch_size` from an ambiguous collection. The batch size we found is "
                    f"{found}. To avoid any miscalculations, use `self.log(..., batch_size=batch_size)`."
                )
                break
    except RecursionError:
        raise RecursionError(message) from None
    if found is None:
        raise ConfigError(message)
    return found
