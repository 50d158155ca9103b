"""Averaging gradients over the live replica groups: the Reducer's buckets (DDP) keep their overlap with
backward, each all-reduced inside the group with c10d and then across groups through torchft's manager;
FSDP's sharded gradients are averaged across groups after its reduce-scatter."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from strategies.comm_device import to_comm
from strategies.fault_tolerance.manager import ReplicaManager


class CrossGroup:
    """The Reducer's bucket collective under fault tolerance (Reducer(cross_group=...)).

    A bucket is divided by `divisor()` (the ranks of every live group) before `all_reduce` sums it: inside
    the group first (when it has several ranks), then across the live groups. The cross-group sums are
    launched strictly in bucket order on every rank, as each group's rank r talks to every other group's
    rank r: a bucket's is launched once its in-group sum is done, checked at each later bucket's launch and
    at the wait. With one rank per group it starts at once, overlapping the rest of backward. The buckets
    are model data on the rank's device (the communication device wherever NCCL runs), handed to both sums as
    the Reducer hands them to its own.
    """

    def __init__(self, manager: Callable[[], ReplicaManager], group: dist.ProcessGroup | None, world: int):
        self._manager, self._group, self._world = manager, group, world
        self._pending: deque[_Bucket] = deque()

    def divisor(self) -> int:
        return self._world * self._manager().participants

    def all_reduce(self, tensor: torch.Tensor) -> _Bucket:
        inner = dist.all_reduce(tensor, group=self._group, async_op=True) if self._world > 1 else None
        bucket = _Bucket(self, tensor, inner)
        self._pending.append(bucket)
        self.advance()
        return bucket

    def advance(self, until: _Bucket | None = None) -> None:
        """Launch the cross-group sum of the oldest buckets whose in-group sum is done (all up to `until`)."""
        while self._pending:
            head = self._pending[0]
            if head.inner is not None and not head.inner.is_completed():
                if until is None:
                    return
                head.inner.wait()
            self._pending.popleft()
            head.cross = self._manager().allreduce_sum(head.tensor)
            if head is until:
                return


class _Bucket:
    """A bucket's two-level sum; `wait()` returns once both are done (a failure leaves the step uncommitted)."""

    def __init__(self, owner: CrossGroup, tensor: torch.Tensor, inner: Any) -> None:
        self.owner, self.tensor, self.inner, self.cross = owner, tensor, inner, None

    def wait(self) -> bool:
        if self.cross is None:
            self.owner.advance(until=self)
        return bool(self.cross.wait())  # type: ignore[union-attr]


def average_across(manager: ReplicaManager, grads: list[torch.Tensor]) -> None:
    """Average `grads` (already averaged inside the group) over the live groups: one flat sum per dtype."""
    by_dtype: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for g in grads:
        by_dtype.setdefault((g.device, g.dtype), []).append(g)
    participants = manager.participants
    for chunk in by_dtype.values():
        # (made on the communication device of the groups' process group: strategies/comm_device.py)
        flat = to_comm(torch.cat([g.reshape(-1) for g in chunk]), manager.device).div_(participants)
        manager.allreduce_sum(flat).wait()
        with torch.no_grad():
            for g, part in zip(chunk, flat.split([g.numel() for g in chunk])):
                g.copy_(part.view_as(g))
