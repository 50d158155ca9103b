"""Pipeline parallel on torch.distributed.pipelining: the task's model is split into stages, each rank runs its
own stage(s) on micro-batches under a GPipe, 1F1B or interleaved 1F1B schedule; with data_parallel_size > 1
each stage is also sharded by ``fully_shard`` over its data-parallel ranks (a 2-D (pp, dp) mesh).

The Task provides the split and the loss (there is no rank that holds the whole model, so its training_step
is not run)::

    class LM(Task):
        def configure_pipeline(self):          # the stages, in order: nn.Modules of this task
            return [nn.Sequential(self.embed, *self.blocks[:2]), nn.Sequential(*self.blocks[2:], self.head)]

        def pipeline_loss(self, output, target):  # the last stage's output -> a micro-batch's mean loss
            return F.cross_entropy(output.flatten(0, 1), target.flatten())

    Trainer(strategy=PipelineStrategy(schedule="1F1B", n_microbatches=4), devices=2).fit(lm)

Batches are ``(input, target)``: the input goes to the first stage, the target to the last. The step's loss
(the mean over the micro-batches, from the last stage; with data_parallel_size > 1 averaged over the
replicas, so the global batch's mean) is broadcast to every rank and is the step's output: log it in ``on_train_batch_end(outputs, ...)`` (``outputs["loss"]``).

Precision as under every strategy: each stage's forward and ``pipeline_loss`` run under the precision's autocast
(bf16-mixed, 16-mixed), and under 16-mixed the loss is scaled, the gradients unscaled and a step with inf/nan
gradients skipped on every rank alike (torch's ShardedGradScaler over the whole group). Validation, test and
predict steps run through the stages, forward only (strategies/pipeline_eval.py): in them ``self(x)`` is the
whole model's forward. Gradient clipping by norm uses the global norm over every stage (strategies/clipping.py).
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from strategies import group_exit, pipeline_eval
from strategies.comm_device import to_comm
from strategies.large.init import init_context
from strategies.large.stages import place_stages, reuse_stages
from strategies.pipeline_checkpoint import PipelineCheckpointIO
from strategies.pipeline_checks import check_batch, check_loader, check_options, check_task
from strategies.precision import Precision
from strategies.process_group import ProcessGroupStrategy
from strategies.sharding import shard_loader
from tandem_core.errors import ConfigError, TaskError

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from trainer.task.base import Task

SCHEDULES = {"GPipe": "ScheduleGPipe", "1F1B": "Schedule1F1B", "Interleaved1F1B": "ScheduleInterleaved1F1B"}


class PipelineStrategy(ProcessGroupStrategy):
    """Pipeline parallel (optionally x FSDP): `pipeline_parallel_size` ranks each hold `stages_per_rank` stages
    of the task's ``configure_pipeline()``.

    Example::

        Trainer(strategy=PipelineStrategy(schedule="Interleaved1F1B", n_microbatches=4), devices=2).fit(task)
        Trainer(strategy=PipelineStrategy(data_parallel_size=2), devices=4).fit(task)  # pp=2 x fsdp=2

    `schedule` is "GPipe", "1F1B" or "Interleaved1F1B" (2 stages per rank by default, looped: rank r holds
    stages r, r + pp, ...). The per-rank batch must be the same at every step and divisible by
    `n_microbatches` (checked on the loader before the first step).
    """

    name = "pipeline"
    fork_start = False

    def __init__(
        self,
        accelerator: str | None = None,
        devices: int | None = None,
        precision: Precision | str | int | None = None,
        num_nodes: int | None = None,
        schedule: str = "1F1B",
        n_microbatches: int | None = None,
        stages_per_rank: int | None = None,
        data_parallel_size: int = 1,
        process_group_backend: str | None = None,
        timeout_s: float = 1800.0,
        max_restarts: int = 0,
        peer_timeout_s: float | None = 20.0,
    ) -> None:
        super().__init__(
            accelerator, devices, precision, num_nodes, process_group_backend, timeout_s, max_restarts, None,
            peer_timeout_s,
        )  # fmt: skip
        check_options(schedule, n_microbatches, stages_per_rank, data_parallel_size, SCHEDULES)
        self.schedule_name, self.data_parallel_size = schedule, data_parallel_size
        self.stages_per_rank = stages_per_rank or (2 if schedule == "Interleaved1F1B" else 1)
        self._n_microbatches = n_microbatches
        self.device_mesh: DeviceMesh | None = None
        self.schedule: Any = None
        self.stage_indices: list[int] = []
        self._own_checkpoint_io(PipelineCheckpointIO(self))
        self._grads: list[tuple[torch.Tensor, torch.Tensor]] = []  # from step to backward
        self._losses: list[torch.Tensor] = []  # this step's micro-batch losses, unscaled
        self.stage_modules: dict[int, torch.nn.Module] = {}  # this rank's stages by index
        self._cast_hooks: list[Any] = []
        self._batch_size: int | None = None  # of the first training batch: every later one must match
        group_exit.on_close(self._release)  # its stages hold the pipeline's group (strategies/group_exit.py)

    def _release(self) -> None:
        """At exit, before the groups close: drop the schedule and with it the stages (they hold the group)."""
        self.schedule = None

    # ----- the mesh ---------------------------------------------------------------------------------
    @property
    def pipeline_parallel_size(self) -> int:
        """The number of pipeline ranks: the world size over data_parallel_size."""
        return self.comm.world_size // self.data_parallel_size

    @property
    def n_microbatches(self) -> int:
        """Micro-batches per step (default: the number of stages)."""
        return self._n_microbatches or self.pipeline_parallel_size * self.stages_per_rank

    @property
    def n_stages(self) -> int:
        """The number of stages: pipeline ranks x stages_per_rank."""
        return self.pipeline_parallel_size * self.stages_per_rank

    @property
    def pp_rank(self) -> int:
        """This rank's position along the pipeline."""
        return self.comm.rank // self.data_parallel_size

    @property
    def dp_rank(self) -> int:
        """This rank's data-parallel replica index."""
        return self.comm.rank % self.data_parallel_size

    def launch(self) -> None:  # (no fork start)
        super().launch()
        world = self.comm.world_size
        if world % self.data_parallel_size:
            raise ConfigError(
                f"PipelineStrategy(data_parallel_size={self.data_parallel_size}) must divide the world size "
                f"{world} (pipeline stages x data-parallel ranks)."
            )
        from torch.distributed.device_mesh import init_device_mesh

        shape = (self.pipeline_parallel_size, self.data_parallel_size)
        self.device_mesh = init_device_mesh(self.root_device.type, shape, mesh_dim_names=("pp", "dp"))

    # ----- life cycle -------------------------------------------------------------------------------
    def setup(self, task: Task) -> None:
        modules = check_task(task, self.n_stages, self.pipeline_parallel_size, self.stages_per_rank)
        # a later stage of this Trainer (validate after fit, fit after validate): this rank's stages as set up
        # (and sharded) then, not new containers around their sharded modules
        modules = reuse_stages(modules, self.stage_modules)
        from torch.distributed import pipelining

        assert self.device_mesh is not None
        pp = self.pipeline_parallel_size
        self.stage_indices = [self.pp_rank + k * pp for k in range(self.stages_per_rank)]
        # only this rank's stages ever reach the device (the others go to, or stay on, the meta device)
        self.precision.setup(self.root_device)
        place_stages(task, modules, self.stage_indices, self.device_mesh, self.root_device, self.precision)
        pp_group = self.device_mesh["pp"].get_group()
        stages = [
            pipelining.PipelineStage(modules[i], i, self.n_stages, self.root_device, group=pp_group)
            for i in self.stage_indices
        ]
        self.stage_modules = {i: modules[i] for i in self.stage_indices}
        self._setup_precision()
        cls = getattr(pipelining, SCHEDULES[self.schedule_name])
        loss_fn = self._loss_of(task)
        try:
            self.schedule = (
                cls(stages, self.n_microbatches, loss_fn=loss_fn, scale_grads=True)
                if self.stages_per_rank > 1
                else cls(stages[0], self.n_microbatches, loss_fn=loss_fn, scale_grads=True)
            )
        except (ValueError, AssertionError) as e:
            raise ConfigError(
                f"PipelineStrategy(schedule={self.schedule_name!r}, n_microbatches={self.n_microbatches}) with "
                f"{pp} pipeline ranks and {self.stages_per_rank} stage(s) each: {e}"
            ) from e
        self._batch_size = None

    def tensor_init_context(self, empty_init: bool | None = None) -> contextlib.AbstractContextManager[Any]:
        """Lightning's meaning, as FSDPStrategy's: on the meta device with `empty_init=True` (each rank then
        allocates only its stages at setup), in the precision's parameter dtype."""
        return init_context("meta" if empty_init else None, self.precision.param_dtype)

    def _setup_precision(self) -> None:
        """Each local stage's forward under the precision's autocast (entered and left by forward hooks, so
        that the schedule's backward runs outside it, as everywhere); under 16-mixed a gradient scaler whose
        inf/nan check is all-reduced over every rank (each holds only its stages' gradients)."""
        for h in self._cast_hooks:
            h.remove()
        self._cast_hooks = []
        precision = self.precision
        if precision.scaler is not None:
            from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

            state = precision.scaler.state_dict()
            precision.scaler = ShardedGradScaler(
                self.root_device.type, process_group=None
            )  # (None: the world)
            precision.scaler.scale(torch.ones((), device=self.root_device))  # its scale exists on every rank
            if state.get("scale") is not None:
                precision.scaler.load_state_dict(state)
        if not precision.casts:
            return
        open_: dict[int, list[Any]] = {}

        def enter(module: torch.nn.Module, args: Any) -> None:
            ctx = precision.autocast()
            ctx.__enter__()
            open_.setdefault(id(module), []).append(ctx)

        def leave(module: torch.nn.Module, args: Any, output: Any) -> None:
            open_[id(module)].pop().__exit__(None, None, None)

        for module in self.stage_modules.values():
            self._cast_hooks.append(module.register_forward_pre_hook(enter))
            self._cast_hooks.append(module.register_forward_hook(leave, always_call=True))

    def _loss_of(self, task: Task) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        """The schedule's loss: `pipeline_loss` under autocast, recorded unscaled, returned scaled (16-mixed)."""
        precision = self.precision

        def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            with precision.autocast():
                loss = task.pipeline_loss(output, target)  # type: ignore[attr-defined]
            self._losses.append(loss.detach())
            return precision.scale(loss)

        return loss_fn

    @property
    def grad_norm_group(self) -> Any:
        """The ranks whose gradients together are the model's (each holds its stages', FSDP shards of them
        under pipeline x FSDP): all of them. Clipping by norm sums the squared norms over it."""
        return dist.group.WORLD

    # ----- data -------------------------------------------------------------------------------------
    def process_dataloader(self, loader: Any, stage: str) -> Any:
        """Shard over the data-parallel ranks only (every stage of a pipeline reads the same batch); a
        training loader's batches must all have one size divisible by n_microbatches."""
        if self.use_distributed_sampler:
            seed = int(os.environ.get("TANDEM_GLOBAL_SEED", 0))
            loader = shard_loader(
                loader, stage, self.dp_rank, self.data_parallel_size, seed, bool(self._overfit_batches)
            )
        if stage == "train":
            check_loader(loader, self.n_microbatches)
        return loader

    # ----- steps ------------------------------------------------------------------------------------
    def step(
        self, task: Task, hook: str, batch: Any, batch_idx: int, dataloader_idx: int | None = None
    ) -> Any:
        if hook != "training_step":
            return self._evaluate(task, hook, batch, batch_idx, dataloader_idx)
        if not task.automatic_optimization:
            raise ConfigError(
                "PipelineStrategy runs the task's optimizer itself: use automatic optimization."
            )
        x, y = _split(batch)
        self._batch_size = check_batch(x, self._batch_size, self.n_microbatches)
        first, last = 0 in self.stage_indices, self.n_stages - 1 in self.stage_indices
        self._losses = []
        args = (x,) if first else ()
        kwargs: dict[str, Any] = {"target": y} if last else {}
        for p in task.parameters():  # the last step's gradients: the loop zeroes them only after this
            p.grad = None
        self.comm.run("pipeline step", lambda: self.schedule.step(*args, **kwargs))
        # the loop zeroes the gradients between training_step and backward (Lightning's order): hand this
        # step's to backward past that
        self._grads = [(p, p.grad) for p in task.parameters() if p.grad is not None]
        for p, _ in self._grads:
            p.grad = None
        loss = (
            # the micro-batches' losses (the schedule's first step also computes one while inferring shapes)
            to_comm(
                torch.stack([v.to(torch.float64) for v in self._losses[-self.n_microbatches :]]).mean(),
                self.comm.device,
            )
            if last
            else torch.zeros((), dtype=torch.float64, device=self.comm.device)
        )
        assert self.device_mesh is not None
        group = self.device_mesh["pp"].get_group()
        src = dist.get_global_rank(group, (self.n_stages - 1) % self.pipeline_parallel_size)
        self.comm.run("pipeline loss broadcast", lambda: dist.broadcast(loss, src=src, group=group))
        if self.data_parallel_size > 1:  # the global batch's mean (the replicas' batches are equal in size)
            dp = self.device_mesh["dp"].get_group()
            self.comm.run("pipeline loss average", lambda: dist.all_reduce(loss, group=dp))
            loss /= self.data_parallel_size
        # the loop wants a loss that requires grad; backward already ran inside the schedule
        return loss.to(self.root_device, self.precision.param_dtype).requires_grad_()

    def backward(
        self, loss: torch.Tensor, sync: bool = True, run: Callable[[torch.Tensor], Any] | None = None
    ) -> None:
        """The gradients the schedule computed inside `step` (every micro-batch's backward ran there)."""
        for p, g in self._grads:
            p.grad = g
        self._grads = []
        if not sync:
            raise ConfigError(
                "PipelineStrategy does not take accumulate_grad_batches > 1: raise n_microbatches (and the "
                "batch size) instead; the schedule accumulates the micro-batches' gradients itself."
            )

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """Nothing around the whole step: the schedule runs backward too; each stage's forward and the loss
        enter the precision's autocast themselves (`_setup_precision`)."""
        return contextlib.nullcontext()

    def _evaluate(self, task: Task, hook: str, batch: Any, batch_idx: int, dataloader_idx: int | None) -> Any:
        """An evaluation step with `self(x)` running through the stages (strategies/pipeline_eval.py)."""
        own = task.__dict__.get("forward")
        task.forward = functools.partial(pipeline_eval.forward, self)  # type: ignore[method-assign]
        try:
            with self.precision.autocast():
                return super().step(task, hook, batch, batch_idx, dataloader_idx)
        except (NotImplementedError, RuntimeError) as e:
            error = pipeline_eval.meta_error(hook, e)
            if error is None:
                raise
            raise error from e
        finally:
            if own is None:
                del task.forward
            else:
                task.forward = own

    def teardown(self) -> None:
        """Remove the autocast hooks and drop the schedule (its stages hold the process group and their
        receive buffers); the next stage's setup builds them again."""
        for h in self._cast_hooks:
            h.remove()
        self._cast_hooks, self.schedule = [], None
        from torch.distributed.fsdp import FSDPModule

        # pipeline x FSDP: an evaluation's forward leaves each stage unsharded (a root keeps its parameters
        # gathered after forward): free them, and give a later stage's optimizer the shards
        for module in self.stage_modules.values():
            if isinstance(module, FSDPModule):
                module.reshard()
        super().teardown()


def _split(batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        return batch[0], batch[1]
    raise TaskError(
        f"PipelineStrategy needs batches of (input, target), got {type(batch).__name__}"
        + (f" of length {len(batch)}" if isinstance(batch, (tuple, list)) else "")
        + ": the input goes to the first stage, the target to pipeline_loss on the last."
    )
