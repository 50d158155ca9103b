"""ParallelStrategy: the base of the strategies that use several devices or processes (Lightning's class).

Besides the narrow contract of strategies/base.py it offers Lightning's names for rank information and
collectives (`world_size`, `global_rank`, `reduce`, `barrier`, ...), all delegating to `strategy.comm`,
so that user code written against Lightning's ParallelStrategy runs unchanged.
"""

from __future__ import annotations

from typing import Any

import torch

from strategies.base import Strategy
from tandem_core.views import view


class ParallelStrategy(Strategy):
    """Base of DataParallelStrategy, DDPStrategy and FSDPStrategy. Example::

    if isinstance(self.trainer.strategy, ParallelStrategy):
        n = self.trainer.strategy.world_size
    """

    world_size = view("comm.world_size")
    global_rank = view("comm.rank")
    local_rank = view("comm.local_rank")
    is_global_zero = view("comm.is_global_zero")

    def reduce(self, tensor: torch.Tensor, reduce_op: str = "mean", group: Any = None) -> torch.Tensor:
        """`reduce_op` ("mean", "sum", "max", "min") over all ranks, or over the ranks of `group`."""
        op = str(reduce_op).lower()
        return self.comm.reduce(tensor, op={"avg": "mean"}.get(op, op), group=group)

    def all_gather(self, tensor: torch.Tensor, group: Any = None, sync_grads: bool = False) -> torch.Tensor:
        """`data` from every rank, stacked (Lightning's all_gather)."""
        return self.comm.all_gather(tensor, group=group, sync_grads=sync_grads)

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        """Rank `src`'s `obj` on every rank."""
        return self.comm.broadcast(obj, src)

    def barrier(self, name: str | None = None) -> None:
        """Wait until every rank has reached this point."""
        self.comm.barrier(name)

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        """True if every rank (all=True) or any rank (all=False) decided True."""
        return not self.comm.any_rank(not decision) if all else self.comm.any_rank(decision)
