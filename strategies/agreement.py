"""Agreements between the ranks that the loop acts on (stop requests, "every rank still has a batch") without
the host ever waiting for the device in a steady-state step.

Each agreement is a 1-element MAX all-reduce started without waiting (`post`), whose answer is read `LAG` posts
later (`take`). On a GPU the reduced value is copied, without blocking, into pinned host memory, and an event
recorded after the copy; `take` waits on that event (long complete by then: the GPU has run `LAG` more steps'
work queued after it, unless it is more than `LAG` steps behind the host, which this then bounds) and reads the
pinned copy, which is host memory: no `.item()`, no device read. On the CPU (gloo) the all-reduce runs on
gloo's own thread, `take` waits on its work handle and reads the tensor itself. Every rank posts and takes at
the same points, so every rank gets the same answer at the same call; buffers are made once and reused.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import torch

LAG = 2  # posts between an agreement's start and the read of its answer


class _Slot:
    """One agreement's buffers: the device tensor all-reduced in place, and where the host reads the answer."""

    def __init__(self, device: torch.device) -> None:
        self.flag = torch.zeros(1, dtype=torch.int32, device=device)
        self.work: Any = None
        if device.type == "cuda":  # the answer is copied to pinned memory behind an event
            self.host = torch.zeros(1, dtype=torch.int32, pin_memory=True)
            self.event: Any = torch.cuda.Event()
        elif device.type == "cpu":  # on the CPU the reduced tensor is host memory already
            self.host, self.event = self.flag, None
        else:  # another device: the answer is copied back when it is taken (a wait there)
            self.host, self.event = torch.zeros(1, dtype=torch.int32), None
        self.view = self.host.numpy()  # the host memory, read without a torch call once the answer is there


class Pipelined:
    """A MAX agreement over the ranks read `lag` posts late. Example (every rank, at the same points)::

    agreed = Pipelined(comm.run, torch.device("cpu"), "stop-request all-reduce")
    agreed.post(flag)          # start this point's agreement
    if agreed.ready: value = agreed.take()   # the answer of the agreement `lag` posts ago
    agreed.drain()             # before the group is used for anything else, or closed
    """

    def __init__(self, run: Callable[..., Any], device: torch.device, op: str, lag: int = LAG) -> None:
        self._run, self._device, self._op, self.lag = run, device, op, lag
        self._pending: deque[_Slot] = deque()
        self._free: list[_Slot] = []

    @property
    def ready(self) -> bool:
        """Whether an answer `lag` posts old is waiting (False for the first `lag` posts)."""
        return len(self._pending) > self.lag

    @property
    def in_flight(self) -> int:
        """How many posted agreements have not been taken."""
        return len(self._pending)

    def post(self, flag: int) -> None:
        """Start the agreement on this rank's `flag` (a small int; the largest over the ranks wins)."""
        import torch.distributed as dist

        slot = self._free.pop() if self._free else _Slot(self._device)
        slot.flag.fill_(flag)  # a fill, not a copy from the host: nothing waits
        slot.work = self._run(self._op, dist.all_reduce, slot.flag, dist.ReduceOp.MAX, None, True)
        if slot.event is not None:
            slot.work.wait()  # (NCCL: the current stream waits for the all-reduce; the host does not)
            slot.host.copy_(slot.flag, non_blocking=True)
            slot.event.record()
        self._pending.append(slot)

    def take(self) -> int:
        """The answer of the oldest agreement in flight (waits for it if it is not complete)."""
        slot = self._pending.popleft()
        if slot.event is not None:
            if not slot.event.query():  # complete by now unless the GPU is more than `lag` posts behind
                slot.event.synchronize()
        else:
            self._run(self._op, slot.work.wait)
            if slot.host is not slot.flag:
                slot.host.copy_(slot.flag)
        slot.work = None
        self._free.append(slot)
        return int(slot.view[0])

    def drain(self) -> list[int]:
        """Finish every agreement in flight; their answers, oldest first."""
        return [self.take() for _ in range(len(self._pending))]
