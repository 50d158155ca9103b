"""Type names a LightningCLI project annotates its parameters with (Lightning's ``lightning.pytorch.cli``):

    def __init__(self, optimizer: OptimizerCallable = torch.optim.Adam, scheduler: LRSchedulerCallable = ...)

so that ``--model.optimizer=SGD --model.optimizer.lr=0.01`` gives the task a callable that builds the
optimizer on the parameters it is given (trainer/cli/trust.py checks that it builds one).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Union

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from trainer.config.optim import ReduceLROnPlateau

try:
    from jsonargparse import Namespace
except ImportError:  # the cli extra is not installed: ArgsType still names the forms a list or dict takes
    Namespace = dict  # type: ignore[assignment,misc]

# the schedulers LightningCLI's lr_scheduler arguments take: torch's, and ReduceLROnPlateau with a monitor
LRSchedulerTypeTuple = (LRScheduler, ReduceLROnPlateau)
LRSchedulerTypeUnion = Union[LRScheduler, ReduceLROnPlateau]  # noqa: UP007 (a runtime value, not an annotation)
LRSchedulerType = Union[type[LRScheduler], type[ReduceLROnPlateau]]  # noqa: UP007
OptimizerCallable = Callable[[Iterable], Optimizer]
LRSchedulerCallable = Callable[[Optimizer], Union[LRScheduler, ReduceLROnPlateau]]  # noqa: UP007
ArgsType = Union[list[str], dict[str, Any], Namespace, None]  # noqa: UP007

__all__ = [
    "ArgsType",
    "LRSchedulerCallable",
    "LRSchedulerType",
    "LRSchedulerTypeTuple",
    "LRSchedulerTypeUnion",
    "OptimizerCallable",
]
