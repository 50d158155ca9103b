"""Collectives between the processes of a job: one object per strategy, ``strategy.comm``.

`Comm` is the single-process version (every collective is the identity); `ProcessGroupComm` runs them on
the torch.distributed default group and turns a failed or timed-out collective into a DistributedError
that names this rank and the operation.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any

import torch

from strategies.agreement import Pipelined
from strategies.comm_device import barrier, to_comm
from strategies.wire import Packed
from tandem_core.errors import DistributedError, check_choice

REDUCE_OPS = ("sum", "mean", "max", "min")
# what gloo (and the c10d store) say when a peer's connection ends: the peer died or its node left
_LOST = (
    "connection closed by peer",
    "connection reset by peer",
    "pair closure",
    "connection refused",
    "broken pipe",
    "no route to host",
    "network is unreachable",
    "remote process exited",  # NCCL's ncclRemoteError: a peer died or its network failed
    "communicator was aborted",  # NCCL: the watchdog aborted the group after a peer's error (timeouts: below)
)
_PEER = re.compile(r"\[([0-9a-fA-F:.]+)\]:\d+|\b((?:\d{1,3}\.){3}\d{1,3}):\d+")


class Comm:
    """Rank information and collectives of a job of one process. Example::

    total = trainer.strategy.comm.reduce(torch.tensor(3.0), op="sum")
    """

    # True where agree_stop is this class's: the process's own stop request is the answer, with no call
    agrees_alone = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.agrees_alone = cls.agree_stop is Comm.agree_stop

    @property
    def world_size(self) -> int:
        """The number of processes in the job."""
        return 1

    @property
    def rank(self) -> int:
        """This process's global rank."""
        return 0

    @property
    def local_rank(self) -> int:
        """This process's rank on its machine."""
        return 0

    @property
    def is_global_zero(self) -> bool:
        """Whether this is global rank 0 (the process that writes files)."""
        return self.rank == 0

    def reduce(self, tensor: torch.Tensor, op: str = "mean", group: Any = None) -> torch.Tensor:
        """`op` ("sum", "mean", "max", "min") of the tensor over all ranks, or over the ranks of `group` (a
        torch.distributed process group)."""
        check_choice("reduce op", op, REDUCE_OPS)
        return tensor

    def all_gather(self, tensor: torch.Tensor, group: Any = None, sync_grads: bool = False) -> torch.Tensor:
        """Every rank's tensor (or every rank's of `group`), stacked along a new dim 0 in rank order; with
        `sync_grads`, gradients flow back through the gather to each rank's tensor."""
        return tensor.unsqueeze(0)

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        """Rank `src`'s picklable object on every rank."""
        return obj

    def gather_object(self, obj: Any) -> list[Any]:
        """Every rank's picklable object, in rank order."""
        return [obj]

    def barrier(self, name: str | None = None) -> None:
        """Wait until every rank arrives."""

    def any_rank(self, flag: bool) -> bool:
        """True if the flag is set on any rank."""
        return flag

    def agree_num_batches(self, n: int | float) -> int | float:
        """The number of batches every rank runs this epoch (the shortest rank's)."""
        return n

    def agree_stop(self, flag: int) -> int:
        """Called by every rank at the same points (step boundaries, validation batches) with this rank's
        stop request (0: none; a larger number wins): the largest over the ranks, non-zero once a stop was
        requested on any rank. Under several processes the answer comes `strategies.agreement.LAG` calls
        later (the host never waits for the device: docs/concepts.md, "Stopping together")."""
        return int(flag)

    def settle_stop(self, flag: int) -> int:
        """Called by every rank at the same points, the end of a pass of agreements (a training epoch's
        batches, an evaluation's): the stop agreement completed now, this rank's `flag` included. Under several
        processes it posts `flag` once more and waits for every answer still in flight (one round-trip per
        pass, never per step); the largest. No stop requested on any rank before this call is left unanswered
        when the stage ends."""
        return int(flag)

    def settle(self) -> None:
        """Finish any agreement still in flight (before the group is used for anything else or closed)."""

    def joins(self) -> Any:
        """For an epoch whose length some rank does not know (an IterableDataset) under several processes: a
        `strategies.agreement.Pipelined` agreement on "this rank is out of data", posted once per batch read
        (trainer/loop/feeds.py). None when every rank's own end of data is everyone's (one process, or known
        lengths, where every rank runs the shortest rank's epoch)."""
        return None


class ProcessGroupComm(Comm):
    """Collectives on torch.distributed's default process group (gloo or NCCL)."""

    def __init__(self, timeout_s: float = 1800.0, planned_world: Callable[[], int] | None = None) -> None:
        self.timeout_s = timeout_s
        # the world size before the job is launched (devices x nodes); a method, not a lambda, so that the
        # strategy pickles (strategy='ddp_spawn' sends it to its workers)
        self._planned_world = planned_world
        # the communication device: where every tensor handed to a collective lives (the rank's GPU under
        # NCCL, the CPU under gloo; set when the strategy joins its group: strategies/comm_device.py)
        self.device = torch.device("cpu")
        self._step_join = False  # per-batch agreement on "every rank still has a batch" (unknown lengths)
        self._agreements: dict[str, Pipelined] = {}  # "stop", "join": made at first use, reused
        # the strategy's cluster environment (strategies/environments/): before this process joins the group
        # (RANK not yet set), the ranks of a process that a scheduler started come from it
        self.environment: Any = None

    def _scheduled(self) -> Any:
        """The environment when it answers for this process: a scheduler started it and RANK is not set yet."""
        env = self.environment
        if env is not None and "RANK" not in os.environ and env.creates_processes_externally:
            return env
        return None

    @property
    def world_size(self) -> int:
        env = self._scheduled()
        if env is not None:
            return env.world_size()
        planned = self._planned_world() if self._planned_world is not None else 1
        return int(os.environ.get("WORLD_SIZE", planned))

    @property
    def rank(self) -> int:
        rank = os.environ.get("RANK")
        if rank is not None:
            return int(rank)
        env = self._scheduled()
        return env.global_rank() if env is not None else 0

    @property
    def local_rank(self) -> int:
        env = self._scheduled()
        return env.local_rank() if env is not None else int(os.environ.get("LOCAL_RANK", 0))

    def run(self, op: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Run a collective; a timeout or a lost peer becomes a DistributedError naming rank and operation."""
        try:
            return fn(*args)
        except RuntimeError as e:
            raise self.translate(op, e) from e

    def translate(self, op: str, e: RuntimeError) -> Exception:
        """The DistributedError for a failed collective (or `e` itself when it is no communication failure)."""
        text, me = str(e), f"rank {self.rank}/{self.world_size}"
        lower, detail = text.lower(), text.strip()[-300:]
        peer = _PEER.search(text)
        who = f"the peer at {peer.group(1) or peer.group(2)}" if peer else "a peer"
        if any(s in lower for s in _LOST) and "timeout" not in lower:
            return DistributedError(
                f"{me}: {op} failed at once: the connection to {who} was lost ({detail}). "
                "That rank's process or node has probably died or was cut off the network: look at its "
                "output (its own error comes first)."
            )
        if "connection timed out" in lower:  # the kernel's ETIMEDOUT: the peer stopped acknowledging
            return DistributedError(
                f"{me}: {op} failed: the connection to {who} timed out in the network ({detail}): "
                "that node stopped answering (cut off the network or powered off). TCP gave up on it after "
                "its retransmissions (net.ipv4.tcp_retries2), well before timeout_s."
            )
        if any(s in lower for s in ("timed out", "timeout")):
            return DistributedError(
                f"{me}: {op} did not complete within timeout_s={self.timeout_s:g}s ({detail}). "
                "Another rank has probably failed or is stuck: look at its output; raise "
                "DDPStrategy(timeout_s=...) if its steps are legitimately this slow."
            )
        return e

    def reduce(self, tensor: torch.Tensor, op: str = "mean", group: Any = None) -> torch.Tensor:
        import torch.distributed as dist

        check_choice("reduce op", op, REDUCE_OPS)
        ops = {"sum": dist.ReduceOp.SUM, "mean": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}
        out = to_comm(tensor, self.device, copy=True)  # (a CPU tensor under NCCL: the result is on the GPU)
        self.run(f"{op} all-reduce", dist.all_reduce, out, ops.get(op, dist.ReduceOp.MIN), group)
        if op != "mean":
            return out
        return out / (self.world_size if group is None else dist.get_world_size(group))

    def all_gather(self, tensor: torch.Tensor, group: Any = None, sync_grads: bool = False) -> torch.Tensor:
        import torch.distributed as dist

        tensor = tensor if tensor.device == self.device else tensor.to(self.device)  # (differentiable)
        if sync_grads:  # torch's autograd-aware gather: each rank's tensor gets its part of the gradient
            from torch.distributed.nn.functional import all_gather

            parts = self.run("all-gather", all_gather, tensor.contiguous(), group or dist.group.WORLD)
            return torch.stack(parts)
        parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
        self.run("all-gather", dist.all_gather, parts, tensor.contiguous(), group)
        return torch.stack(parts)

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        import torch.distributed as dist

        box: list[Any] = [Packed(obj)]  # (tensors as bytes: strategies/wire.py)
        self.run("broadcast", dist.broadcast_object_list, box, src)
        return obj if isinstance(box[0], Packed) else box[0]  # (the source keeps its own object)

    def gather_object(self, obj: Any) -> list[Any]:
        import torch.distributed as dist

        out: list[Any] = [None] * self.world_size
        self.run("object all-gather", dist.all_gather_object, out, Packed(obj))
        return out

    def barrier(self, name: str | None = None) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            self.run(f"barrier{f' ({name})' if name else ''}", barrier, self.device)

    def any_rank(self, flag: bool) -> bool:
        return self._any(flag, "stop-request all-reduce")

    def _any(self, flag: bool, op: str) -> bool:
        """True if `flag` is set on any rank: a 1-element MAX all-reduce."""
        import torch.distributed as dist

        flag_t = torch.tensor([1 if flag else 0], dtype=torch.int32, device=self.device)
        self.run(op, dist.all_reduce, flag_t, dist.ReduceOp.MAX)
        return bool(flag_t.item())

    def agree_stop(self, flag: int) -> int:
        """A pipelined agreement (strategies/agreement.py): each call starts a 1-element MAX all-reduce of this
        rank's flag without waiting, and returns the answer of the one started `LAG` calls earlier (0 for the
        first `LAG` calls), read from host memory once complete. Every rank gets the same answer at the same
        call, `LAG` calls late, and no call reads a device value on the host."""
        stops = self._agreement("stop", "stop-request all-reduce")
        stops.post(int(flag))
        return stops.take() if stops.ready else 0

    def settle_stop(self, flag: int) -> int:
        stops = self._agreement("stop", "stop-request all-reduce")
        stops.post(int(flag))
        return max(stops.drain())

    def _agreement(self, name: str, op: str) -> Pipelined:
        found = self._agreements.get(name)
        if found is None:
            found = self._agreements[name] = Pipelined(self.run, self.device, op)
        return found

    def settle(self) -> None:
        for agreement in self._agreements.values():
            agreement.drain()

    def joins(self) -> Pipelined | None:
        if not self._step_join:
            return None
        joins = self._agreement("join", "join all-reduce")
        joins.drain()  # (an earlier epoch's, cut short by a stop, a hook or max_steps)
        return joins

    def agree_num_batches(self, n: int | float) -> int | float:
        """Every rank runs the shortest rank's epoch (one all-gather per epoch), so uneven loaders cannot
        leave a rank waiting in a collective; with an unknown length (an IterableDataset) the ranks agree
        batch by batch instead (see `joins`)."""
        unknown = -1
        mine = torch.tensor([unknown if n == float("inf") else int(n)], dtype=torch.int64, device=self.device)
        lengths = self.all_gather(mine).view(-1).tolist()
        self._step_join = unknown in lengths and len(lengths) > 1
        known = [v for v in lengths if v != unknown]
        return min(known) if known else float("inf")
