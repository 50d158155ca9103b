"""What a memory plan says: each rank's predicted peak bytes in a training step and what they hold, and whether
that fits the device (trainer/plan.py makes one)."""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch

_GIB = 1024**3


@dataclass
class RankPlan:
    """One rank's prediction, in bytes: its parameters, gradients and optimizer state (its shards of them),
    and the rest of its peak (activations kept for backward, temporaries, gathered parameters, communication
    buffers and the batch), at the moment of the peak. `peak` is their sum."""

    rank: int
    parameters: int
    gradients: int
    optimizer: int
    activations: int

    @property
    def peak(self) -> int:
        return self.parameters + self.gradients + self.optimizer + self.activations


@dataclass
class MemoryPlan:
    """The predicted peak of every rank of a run (``plan.ranks``), without anything allocated; `device_bytes`:
    the memory of one rank's device (a GPU's; on a CPU the node's available memory over its ranks)."""

    strategy: str
    world_size: int
    ranks: list[RankPlan] = field(default_factory=list)
    device_bytes: int | None = None

    @property
    def peak(self) -> int:
        """The largest rank's peak."""
        return max(r.peak for r in self.ranks)

    @property
    def fits(self) -> bool | None:
        """Whether every rank's peak fits its device (None when the device's memory is unknown)."""
        return None if self.device_bytes is None else self.peak <= self.device_bytes

    def table(self) -> str:
        """The plan as a text table (MiB, or GiB from 10 GiB on)."""
        unit, div = ("GiB", _GIB) if self.peak >= 10 * _GIB else ("MiB", 1024**2)
        head = f"memory plan: strategy={self.strategy}, {self.world_size} rank(s), {unit} per rank"
        cols = ("rank", "params", "grads", "optimizer", "activations", "peak")
        rows = [
            [str(r.rank)]
            + [f"{v / div:.1f}" for v in (r.parameters, r.gradients, r.optimizer, r.activations, r.peak)]
            for r in self.ranks
        ]
        width = [max(len(c), *(len(row[i]) for row in rows)) for i, c in enumerate(cols)]
        lines = [head, "  ".join(c.rjust(w) for c, w in zip(cols, width))]
        lines += ["  ".join(v.rjust(w) for v, w in zip(row, width)) for row in rows]
        if self.device_bytes is not None:
            verdict = "fits" if self.fits else "DOES NOT FIT"
            lines.append(f"device: {self.device_bytes / div:.1f} {unit} per rank: {verdict}")
        return "\n".join(lines)


def device_bytes(device: torch.device, local_ranks: int) -> int | None:
    """The memory one rank may use: a GPU's total memory; on a CPU the node's available memory (MemAvailable)
    shared by its `local_ranks` processes. None where unknown."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    if device.type == "cpu" and os.path.exists("/proc/meminfo"):
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024 // max(local_ranks, 1)
    return None


def local_bytes(tensors: list[torch.Tensor]) -> int:
    """Bytes of these tensors on this rank (a DTensor's local shard; nothing for meta tensors)."""
    from torch.distributed.tensor import DTensor

    total = 0
    for t in tensors:
        t = t.to_local() if isinstance(t, DTensor) else t
        if not t.is_meta:
            total += t.numel() * t.element_size()
    return total


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of `optimizer`'s state after its first step: counted when it has stepped, else rehearsed on fake
    twins of its parameters (this rank's shapes), with nothing allocated."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.tensor import DTensor

    from strategies.zero import _accepted, state_bytes

    if optimizer.state:
        return state_bytes(optimizer)
    # each parameter as this rank holds it (a DTensor's local shard), read before the fake mode: a DTensor's
    # to_local inside it is an error (its local tensor is a real one)
    local_params = [
        [(p.to_local() if isinstance(p, DTensor) else p) for p in group["params"]]
        for group in optimizer.param_groups
    ]
    with FakeTensorMode():
        groups = []
        for group, held in zip(optimizer.param_groups, local_params):
            twins = []
            for local in held:
                twin = torch.nn.Parameter(torch.empty(local.shape, dtype=local.dtype))
                twin.grad = torch.empty_like(twin)
                twins.append(twin)
            groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": twins})
        try:
            rehearsal = type(optimizer)(groups, **_accepted(optimizer))
            rehearsal.step()
        except Exception:  # an optimizer that cannot be rebuilt or stepped so: its state is not predicted
            return 0
        return state_bytes(rehearsal)


def static_bytes(
    strategy: object, task: torch.nn.Module, optimizers: list[torch.optim.Optimizer]
) -> tuple[int, int, int]:
    """This rank's (parameters, gradients, optimizer states) in bytes once set up; under ZeRO-1 its share of
    the optimizer states (about 1/world size: whole parameters are assigned to ranks)."""
    params = list(task.parameters())
    states = sum(optimizer_state_bytes(o) for o in optimizers)
    if getattr(strategy, "zero", 0):
        states //= max(getattr(getattr(strategy, "comm", None), "world_size", 1), 1)
    return local_bytes(params), local_bytes([p for p in params if p.requires_grad]), states


def check_fits(
    strategy: Any, task: torch.nn.Module, optimizers: list[torch.optim.Optimizer], local_ranks: int | str
) -> None:
    """At setup (after configure_optimizers): warn, on rank 0, when this rank's parameters, gradients and
    optimizer states alone will not fit its device (activations come on top; `tandem plan` predicts them).
    `local_ranks`: the Trainer's `devices`; where that is not a number ("auto", or a strategy given its own
    devices) this node's processes are the launcher's LOCAL_WORLD_SIZE."""
    comm = strategy.comm
    if not isinstance(local_ranks, int) or isinstance(local_ranks, bool):
        local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE") or comm.world_size)
    room = device_bytes(strategy.root_device, local_ranks if comm.world_size > 1 else 1)
    if room is None or 5 * local_bytes(list(task.parameters())) <= room:  # fits even with 3 states per weight
        return
    weights, grads, states = static_bytes(strategy, task, optimizers)
    need = weights + grads + states
    cpu = strategy.root_device.type == "cpu"
    # on a CPU the parameters are allocated already (MemAvailable no longer counts them)
    if need - (weights if cpu else 0) > room and comm.is_global_zero:
        warnings.warn(
            f"memory: each rank needs {need / _GIB:.2f} GiB for its parameters, gradients and optimizer state "
            f"({weights / _GIB:.2f} + {grads / _GIB:.2f} + {states / _GIB:.2f}), activations not counted, but "
            f"its device has {room / _GIB:.2f} GiB {'free' if cpu else 'in all'}: this run will run out of "
            "memory. Shard further (strategy='fsdp', more devices), use a bf16 precision, or a smaller model; "
            "`tandem plan` predicts the whole peak.",
            ResourceWarning,
            stacklevel=3,
        )


def holders(strategy: Any, optimizers: list[torch.optim.Optimizer]) -> list[torch.optim.Optimizer]:
    """The optimizers whose state this rank holds: the task's, or under ZeRO-1 their sharded twins."""
    sharded = getattr(strategy, "sharded_optimizers", None)
    return sharded.local_optimizers() if sharded is not None else list(optimizers)
