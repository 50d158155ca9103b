"""A strategy written outside Tandem: Local SGD (docs/strategies/writing.md).

Each process trains its own replica on its shard of the data and the replicas' parameters are averaged every
`average_every` optimizer steps, instead of averaging every step's gradients as DDP does: k times fewer
collectives. With ``average_every=1`` and plain SGD it trains exactly as DDP (the update is linear in the
gradient); tests/test_strategy_example.py checks that against strategy="ddp".

    Trainer(strategy=LocalSGDStrategy(average_every=4), devices=2).fit(task)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from strategies.process_group import ProcessGroupStrategy  # launch, join, samplers, comm: all inherited
from tandem_core.errors import ConfigError  # the bottom layer: what every package may import


class LocalSGDStrategy(ProcessGroupStrategy):
    """Data parallel with the parameters averaged every `average_every` optimizer steps."""

    name = "local_sgd"

    def __init__(self, average_every: int = 4, **kwargs: Any) -> None:
        super().__init__(**kwargs)  # accelerator, devices, precision, num_nodes, timeout_s, ...
        if average_every < 1:
            raise ConfigError(f"LocalSGDStrategy(average_every={average_every}): pass an int >= 1")
        self.average_every = average_every
        self.steps = 0  # optimizer steps since the parameters were last averaged
        self._task: torch.nn.Module | None = None

    def setup(self, task: torch.nn.Module) -> None:
        super().setup(task)  # moves the task to root_device (and converts SyncBatchNorm when asked)
        self._task = task
        for tensor in [*task.parameters(), *task.buffers()]:  # every replica starts from rank 0's weights
            dist.broadcast(tensor.data, src=0)

    def optimizer_step(
        self, optimizer: torch.optim.Optimizer, closure: Callable[[], Any] | None = None
    ) -> Any:
        out = super().optimizer_step(optimizer, closure)  # backward stayed local: no gradient all-reduce
        self.steps += 1
        if self.steps == self.average_every:
            self.comm.run("parameter average", self._average)  # a failing rank names this collective
            self.steps = 0
        return out

    def _average(self) -> None:
        assert self._task is not None
        for p in self._task.parameters():
            dist.all_reduce(p.data)
            p.data /= self.comm.world_size

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "steps": self.steps}  # a resume averages at the same steps

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.steps = state.get("steps", 0)
