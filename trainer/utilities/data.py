"""Small data helpers of Lightning's: move_data_to_device, suggested_max_num_workers, is_picklable."""

from __future__ import annotations

import os
import pickle
from typing import Any

import torch

from strategies.batch import apply_to_tensors


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
