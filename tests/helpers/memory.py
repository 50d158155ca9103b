"""Measuring a real run's memory per rank, for the memory plan's and the large-model tests: the peak bytes torch's
CPU allocator held from before the task was built to the end of fit (strategies/memory/measure.py), and what the
rank's parameters, gradients and optimizer state hold at the end (a floor no sound measured peak is below)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import DataLoader

from strategies.memory.measure import allocation_peak
from tests.conftest import FAST


class Repeat:
    """A map-style data set of `n` copies of one sample (a batch of the loader is `batch_size` of them)."""

    def __init__(self, sample: Any, n: int) -> None:
        self.sample, self.n = sample, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        return self.sample


def measured_peak(
    make: Callable[[], Any], sample: Any, batch_size: int, steps: int = 2, **options: Any
) -> tuple[int, int]:
    """The allocator's peak (bytes) over building ``make()`` inside trainer.init_module(empty_init=True) and
    fitting it `steps` steps on batches of `batch_size` copies of `sample`; and the bytes its parameters,
    gradients and optimizer state hold once fit ends (`held_states`)."""
    from trainer import Trainer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = Trainer(max_steps=steps, **{**FAST, **options})
        loader = DataLoader(Repeat(sample, batch_size * steps * 8), batch_size=batch_size)
        with allocation_peak() as peak:
            with trainer.init_module(empty_init=True):
                task = make()
            trainer.fit(task, loader)
            floor = held_states(trainer, task)
    return peak.bytes, floor


def held_states(trainer: Any, task: torch.nn.Module) -> int:
    """Bytes of the distinct storages behind this rank's parameters, their gradients and the optimizer state it
    holds (under ZeRO-1 its share), read from the live tensors (a DTensor's local shard)."""
    from torch.distributed.tensor import DTensor

    sharded = getattr(trainer.strategy, "sharded_optimizers", None)
    optimizers = list(trainer.optimizers) + (sharded.local_optimizers() if sharded is not None else [])
    tensors = [t for p in task.parameters() for t in (p, p.grad)]
    tensors += [v for o in optimizers for state in o.state.values() for v in state.values()]
    storages = {}
    for t in tensors:
        if isinstance(t, torch.Tensor):
            t = t.to_local() if isinstance(t, DTensor) else t
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(storages.values())
