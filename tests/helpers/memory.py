"""Measuring a real run's memory per rank, for the memory plan's and the large-model tests: the peak bytes torch's
CPU allocator held from before the task was built to the end of fit (strategies/memory/measure.py)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

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
) -> int:
    """The allocator's peak (bytes) over building ``make()`` inside trainer.init_module(empty_init=True) and
    fitting it `steps` steps on batches of `batch_size` copies of `sample`."""
    from trainer import Trainer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = Trainer(max_steps=steps, **{**FAST, **options})
        loader = DataLoader(Repeat(sample, batch_size * steps * 8), batch_size=batch_size)
        with allocation_peak() as peak:
            with trainer.init_module(empty_init=True):
                task = make()
            trainer.fit(task, loader)
    return peak.bytes
