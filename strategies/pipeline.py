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
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

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
        self._batch_size: int | None = None  # of the first training batch: every later one must match

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
        config = getattr(getattr(task, "_trainer", None), "config", None)
        if getattr(config, "gradient_clip_val", None) and self.pipeline_parallel_size > 1:
            raise ConfigError(
                "PipelineStrategy with gradient_clip_val: each rank holds only its stages' gradients, so clipping "
                "would use each stage's own norm instead of the model's; drop gradient_clip_val (not supported "
                "under a pipeline yet)."
            )
        super().setup(task)  # the whole task on the device, in the parameter dtype
        from torch.distributed import pipelining

        assert self.device_mesh is not None
        pp = self.pipeline_parallel_size
        self.stage_indices = [self.pp_rank + k * pp for k in range(self.stages_per_rank)]
        local = {id(modules[i]) for i in self.stage_indices}
        for module in modules:  # free what other ranks compute: only this rank's stages keep parameters
            if id(module) not in local:
                module.to("meta")
        pp_group = self.device_mesh["pp"].get_group()
        stages = []
        for i in self.stage_indices:
            module = modules[i]
            if self.data_parallel_size > 1:
                from torch.distributed.fsdp import fully_shard

                fully_shard(module, mesh=self.device_mesh["dp"])
            stages.append(
                pipelining.PipelineStage(module, i, self.n_stages, self.root_device, group=pp_group)
            )
        cls = getattr(pipelining, SCHEDULES[self.schedule_name])
        loss_fn = _loss_of(task)
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
            raise TaskError(
                f"PipelineStrategy runs training only ({hook} needs the whole model on one rank); train with "
                "it, then evaluate the checkpoint under strategy='single' or 'ddp' (set limit_val_batches=0)."
            )
        if not task.automatic_optimization:
            raise ConfigError(
                "PipelineStrategy runs the task's optimizer itself: use automatic optimization."
            )
        x, y = _split(batch)
        self._batch_size = check_batch(x, self._batch_size, self.n_microbatches)
        first, last = 0 in self.stage_indices, self.n_stages - 1 in self.stage_indices
        losses: list[torch.Tensor] = []
        args = (x,) if first else ()
        kwargs: dict[str, Any] = {"target": y, "losses": losses} if last else {}
        for p in task.parameters():  # the last step's gradients: the loop zeroes them only after this
            p.grad = None
        self.comm.run("pipeline step", lambda: self.schedule.step(*args, **kwargs))
        # the loop zeroes the gradients between training_step and backward (Lightning's order): hand this
        # step's to backward past that
        self._grads = [(p, p.grad) for p in task.parameters() if p.grad is not None]
        for p, _ in self._grads:
            p.grad = None
        loss = (
            torch.stack([v.detach() for v in losses]).mean().to(torch.float64)
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
        return loss.to(self.precision.param_dtype).requires_grad_()

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
        return contextlib.nullcontext()


def _loss_of(task: Task) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return task.pipeline_loss(output, target)  # type: ignore[attr-defined]

    return loss_fn


def _split(batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        return batch[0], batch[1]
    raise TaskError(
        f"PipelineStrategy needs batches of (input, target), got {type(batch).__name__}"
        + (f" of length {len(batch)}" if isinstance(batch, (tuple, list)) else "")
        + ": the input goes to the first stage, the target to pipeline_loss on the last."
    )
