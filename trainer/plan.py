"""The memory plan before launch: each rank's peak in a training step, predicted without allocating anything.

    plan = plan_memory(lambda: GPT(cfg), batch, strategy="fsdp", devices=4, precision="bf16-mixed")
    print(plan.table())                       # or: tandem plan --config run.yaml [trainer.devices=8]

Every rank is rehearsed in turn, in this process: in a fake process group as that rank (strategies/memory/
simulate.py), the task built on the meta device (as ``Trainer.init_module(empty_init=True)`` builds it), then
the strategy's own ``setup`` and `steps` training steps (training_step, backward, the optimizer's step) on fake
tensors of `batch`'s shapes (one rank's batch, as its loader yields it), while every storage they would allocate
is counted (strategies/memory/tracker.py). The peak is what the run holds through torch's allocator (what
``max_memory_allocated`` reports on a GPU); the interpreter and torch's libraries (a few hundred MB of a
process's resident set) come on top. The warning at setup is strategies/memory/plan.py's `check_fits`; a
config's plan (`tandem plan`) is trainer/config/plan.py.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from strategies.base import pick_device
from strategies.memory.plan import MemoryPlan, RankPlan, device_bytes, holders
from strategies.memory.simulate import fake_copy, fake_world, pipeline_step
from strategies.memory.tracker import LiveBytes
from tandem_core.errors import ConfigError
from tandem_core.hooks import overrides

if TYPE_CHECKING:
    from trainer.task.base import Task
    from trainer.trainer import Trainer

_QUIET = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)


def plan_memory(
    task: Callable[[], Task],
    batch: Any,
    steps: int = 2,
    ranks: list[int] | None = None,
    **trainer_options: Any,
) -> MemoryPlan:
    """The predicted peak of each rank (all of them, or `ranks`) of ``Trainer(**trainer_options)`` training
    ``task()`` on batches like `batch`. `task` builds the task (it is called once per rank, on the meta device)."""
    if steps < 1:
        raise ConfigError(f"plan_memory(steps={steps}) must rehearse at least one step.")
    options = {**trainer_options, **_QUIET, "accelerator": "cpu"}
    probe = _trainer(options)
    world = probe.strategy.comm.world_size
    local = probe.config.devices
    plan = MemoryPlan(probe.strategy.name, world)
    # the device the run will use decides its backend: gloo stages FSDP's collectives in temporaries, NCCL not
    gloo = pick_device(trainer_options.get("accelerator") or "auto").type == "cpu"
    for rank in range(world) if ranks is None else ranks:
        plan.ranks.append(_rehearse(task, batch, options, rank, world, local, steps, gloo))
    plan.device_bytes = device_bytes(torch.device(trainer_options.get("accelerator") or "cpu"), local)
    return plan


def _trainer(options: dict[str, Any]) -> Trainer:
    from trainer.trainer import Trainer

    strategy = options.get("strategy")
    if strategy is not None and not isinstance(strategy, str):
        strategy = copy.deepcopy(strategy)  # each rank's rehearsal its own, on the CPU
        strategy.accelerator, strategy._root_device = options["accelerator"], None
        options = {**options, "strategy": strategy}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Trainer(**options)


class _NoLogs:
    """The rehearsal logs nothing (self.log in training_step)."""

    iter_training = False

    def log(self, *args: Any, **kwargs: Any) -> None:
        pass


def _rehearse(
    make: Callable[[], Task],
    batch: Any,
    options: dict[str, Any],
    rank: int,
    world: int,
    local: int,
    steps: int,
    gloo: bool,
) -> RankPlan:
    from torch._subclasses.fake_tensor import FakeTensorMode

    from strategies.pipeline import PipelineStrategy
    from trainer.loop.optim import parse_optimizers

    with fake_world(rank, world, local, gloo=gloo), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = _trainer(options)
        strategy = trainer.strategy
        strategy.launch()
        with torch.device("meta"):
            task = make()
        trainer.metric_store = _NoLogs()  # type: ignore[assignment]
        task._trainer = trainer
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        optimizers: list[torch.optim.Optimizer] = []
        with mode, LiveBytes(lambda: _kinds(task, holders(strategy, optimizers))) as live:
            if overrides(task, "configure_model"):
                with strategy.tensor_init_context():
                    task.configure_model()
            strategy.connect(task)
            strategy.setup(task)
            optimizers += parse_optimizers(task.configure_optimizers(), task.automatic_optimization)[0]
            data = strategy.batch_to_device(fake_copy(batch, mode, live))
            buffers: dict[Any, Any] = {}  # (a pipeline stage's receive buffers, kept from step to step)
            for i in range(steps):
                if isinstance(strategy, PipelineStrategy):
                    pipeline_step(strategy, task, data, buffers)
                else:
                    _step(strategy, task, data, i, optimizers[0])
                for opt in optimizers:
                    strategy.optimizer_step(opt)
            return _attribute(rank, live)


def _step(strategy: Any, task: Task, batch: Any, i: int, optimizer: torch.optim.Optimizer) -> None:
    """training_step, zero_grad and backward, in the loop's order (Lightning's closure)."""
    with strategy.autocast():
        out = strategy.step(task, "training_step", batch, i)
    loss = out["loss"] if isinstance(out, dict) else out
    optimizer.zero_grad(set_to_none=True)
    strategy.backward(loss)
    strategy.unscale_gradients(optimizer)


def _kinds(task: Task, optimizers: list[torch.optim.Optimizer]) -> dict[str, set[int]]:
    """The storages of the parameters, gradients and optimizer states now (asked at each new peak)."""
    params = list(task.parameters())
    return {
        "parameters": LiveBytes.keys(params),
        "gradients": LiveBytes.keys(p.grad for p in params),
        "optimizer": LiveBytes.keys(v for o in optimizers for s in o.state.values() for v in s.values()),
    }


def _attribute(rank: int, live: LiveBytes) -> RankPlan:
    """Split the peak by what its storages were then; the rest is activations, temporaries and buffers."""
    held = {k: sum(live.at_peak.get(key, 0) for key in keys) for k, keys in live.groups.items()}
    p, g, o = held.get("parameters", 0), held.get("gradients", 0), held.get("optimizer", 0)
    return RankPlan(rank, p, g, o, max(live.peak - p - g - o, 0))
