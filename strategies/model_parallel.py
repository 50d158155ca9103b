"""Tensor parallel and FSDP x TP on a 2-D device mesh (Lightning's ModelParallelStrategy): one process per
device, the mesh ("data_parallel", "tensor_parallel") built at launch, the model parallelized by the task's own
``configure_model`` with torch's ``parallelize_module`` and ``fully_shard``, data sharded over the
data-parallel ranks only, checkpoints through torch.distributed.checkpoint (as FSDPStrategy's)."""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from strategies.base import call_step
from strategies.fsdp import FSDPStrategy
from strategies.fsdp_wrap import STEPS, check_supported
from strategies.large.init import materialize, misplaced, sync_replicas
from strategies.large.weights import covered, load_pending
from strategies.precision import Precision
from strategies.process_group import ProcessGroupStrategy, shard_loader
from strategies.syncbn import convert_sync_batchnorm
from tandem_core.errors import ConfigError, TaskError
from tandem_core.hooks import overrides

if TYPE_CHECKING:
    from trainer.task.base import Task

DIMS = ("data_parallel", "tensor_parallel")  # the mesh's dimension names, as in Lightning


def mesh_shape(
    data_parallel_size: int | str, tensor_parallel_size: int | str, devices: int, nodes: int
) -> tuple[int, int]:
    """(dp, tp) for `devices` processes per node on `nodes` nodes, with Lightning's rules: "auto" data
    parallel is the number of nodes, "auto" tensor parallel the processes per node, and dp x tp must be the
    world size."""
    dp = nodes if data_parallel_size == "auto" else int(data_parallel_size)
    tp = devices if tensor_parallel_size == "auto" else int(tensor_parallel_size)
    world = devices * nodes
    if dp * tp != world:
        raise ConfigError(
            f"ModelParallelStrategy(data_parallel_size={data_parallel_size!r}, tensor_parallel_size="
            f"{tensor_parallel_size!r}) gives a {dp} x {tp} mesh, but the world size is {world} (devices={devices}"
            f' x num_nodes={nodes}); choose sizes whose product is {world} ("auto" data parallel is num_nodes, '
            '"auto" tensor parallel is devices).'
        )
    return dp, tp


def _size(name: str, value: int | str) -> int | str:
    if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return value
    raise ConfigError(f"ModelParallelStrategy({name}={value!r}) must be 'auto' or a positive int.")


class ModelParallelStrategy(FSDPStrategy):
    """Tensor parallelism and its 2-D combination with FSDP, on torch's DTensor. Example::

        class GPT(Task):
            def configure_model(self):
                tp, dp = self.device_mesh["tensor_parallel"], self.device_mesh["data_parallel"]
                parallelize_module(self.block, tp, {"attn.q": ColwiseParallel(), "attn.o": RowwiseParallel()})
                fully_shard(self.block, mesh=dp)

        Trainer(strategy=ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=2), devices=4)

    Launch, precision, accumulation and checkpoints are FSDPStrategy's; what differs: the mesh is 2-D and
    built before ``configure_model``, which the task must override (Tandem shards nothing itself); the
    training data is sharded over the data-parallel ranks (the ranks of one tensor-parallel group get the
    same batches); with more than one data-parallel rank every parameter must be sharded on the
    "data_parallel" dimension (``fully_shard``), else the replicas' gradients would never be averaged.
    `loss_parallel=True` runs every step and its backward inside torch's ``loss_parallel()`` (cross entropy
    on class-sharded logits); a step that returns a DTensor loss (it used ``loss_parallel()`` itself) gets
    its backward run inside it as well. Gradient clipping works on the mixed meshes (strategies/clipping.py).
    """

    name = "model_parallel"

    def __init__(
        self,
        data_parallel_size: int | str = "auto",
        tensor_parallel_size: int | str = "auto",
        save_distributed_checkpoint: bool = True,
        process_group_backend: str | None = None,
        timeout: datetime.timedelta | float | None = datetime.timedelta(minutes=30),
        loss_parallel: bool = False,
        accelerator: str | None = None,
        devices: int | None = None,
        precision: Precision | str | int | None = None,
        num_nodes: int | None = None,
        max_restarts: int = 0,
        peer_timeout_s: float | None = 20.0,
    ) -> None:
        if isinstance(timeout, datetime.timedelta):
            timeout = timeout.total_seconds()
        super().__init__(
            accelerator=accelerator,
            devices=devices,
            precision=precision,
            num_nodes=num_nodes,
            save_full=not save_distributed_checkpoint,
            process_group_backend=process_group_backend,
            timeout_s=1800.0 if timeout is None else float(timeout),
            max_restarts=max_restarts,
            peer_timeout_s=peer_timeout_s,
        )
        self.data_parallel_size = _size("data_parallel_size", data_parallel_size)
        self.tensor_parallel_size = _size("tensor_parallel_size", tensor_parallel_size)
        self.save_distributed_checkpoint = save_distributed_checkpoint
        self.loss_parallel = loss_parallel
        self._dtensor_loss = (
            False  # the last training step returned a DTensor loss (loss_parallel in the step)
        )

    @property
    def mesh_shape(self) -> tuple[int, int]:
        """(data_parallel_size, tensor_parallel_size) resolved for this world (a ConfigError if they do not fit)."""
        devices, nodes = self._world
        return mesh_shape(self.data_parallel_size, self.tensor_parallel_size, devices, nodes)

    # ----- life cycle ---------------------------------------------------------------------------
    def launch(self) -> None:
        shape = self.mesh_shape  # checked before any worker starts
        ProcessGroupStrategy.launch(self)  # (FSDPStrategy's builds a 1-D mesh)
        if self.device_mesh is None or tuple(self.device_mesh.shape) != shape:
            from torch.distributed.device_mesh import init_device_mesh

            self.device_mesh = init_device_mesh(self.root_device.type, shape, mesh_dim_names=DIMS)

    def setup(self, task: Task) -> None:
        if self.precision.name == "16-mixed":
            raise ConfigError(
                "strategy='model_parallel' does not support precision='16-mixed' (its gradient scaler cannot see "
                "DTensor gradients); use precision='bf16-mixed' or '32-true'."
            )
        if not overrides(task, "configure_model"):
            raise TaskError(
                f"strategy='model_parallel' needs {type(task).__name__}.configure_model(): Tandem does not split "
                "the model itself. Override it and parallelize there, on self.device_mesh: "
                "parallelize_module(..., self.device_mesh['tensor_parallel'], plan) and/or "
                "fully_shard(..., mesh=self.device_mesh['data_parallel'])."
            )
        check_supported(task)
        # configure_model split the task already: what it built on the meta device gets its shards
        # allocated and reset here (each rank its own random stream, replicas made equal), the rest moves
        if self.sync_batchnorm:
            convert_sync_batchnorm(task, self.root_device)
        self.precision.setup(self.root_device)
        sharded = self.comm.world_size > 1
        materialize(task, self.root_device, covered(task), sharded, sync_replicas if sharded else None)
        if misplaced(task, self.root_device, self.precision.param_dtype):
            task.to(device=self.root_device, dtype=self.precision.param_dtype)
        load_pending(task, sharded=sharded, reader=self.comm.is_global_zero)
        self._task, self._unsynced, self._sync, self._checked = task, False, True, set()
        self._dtensor_loss = False
        self._check_data_parallel(task)
        from torch.distributed.fsdp import FSDPModule, register_fsdp_forward_method

        self.units = [n for n, m in task.named_modules() if isinstance(m, FSDPModule)]
        if isinstance(task, FSDPModule) and not getattr(task, "_tandem_steps_registered", False):
            # configure_model sharded the task itself: its steps gather the root's parameters as forward does
            for step in STEPS:
                register_fsdp_forward_method(task, step)
            task._tandem_steps_registered = True  # type: ignore[attr-defined]  (a later stage: not twice)

    def _check_data_parallel(self, task: Task) -> None:
        """With dp > 1, every parameter must be sharded (or replicated) on the data-parallel dimension."""
        assert self.device_mesh is not None
        from torch.distributed.tensor import DTensor

        if self.device_mesh["data_parallel"].size() == 1:
            plain = [n for n, p in task.named_parameters() if not isinstance(p, DTensor)]
            if plain and len(plain) < len(list(task.parameters())) and self.root_device.type == "cuda":
                # torch's optimizers step CUDA parameters with foreach ops, which refuse a list that mixes
                # DTensors and plain tensors ("got mixed torch.Tensor and DTensor") at the first step
                raise TaskError(
                    f"strategy='model_parallel' on CUDA: parameters {plain[:5]} are plain tensors next to DTensor "
                    "parameters, which torch's optimizers cannot step together on a GPU. In configure_model "
                    "apply fully_shard(self, mesh=self.device_mesh['data_parallel']) after parallelize_module "
                    "(every parameter becomes a DTensor; docs/strategies/model_parallel.md)."
                )
            return
        left = [
            n
            for n, p in task.named_parameters()
            if not (isinstance(p, DTensor) and DIMS[0] in (p.device_mesh.mesh_dim_names or ()))
        ]
        if left:
            raise TaskError(
                f"strategy='model_parallel' with data_parallel_size={self.device_mesh['data_parallel'].size()}: "
                f"parameters {left[:5]} are not sharded on the 'data_parallel' mesh dimension, so their gradients "
                "would never be averaged across the data-parallel replicas. In configure_model apply "
                "fully_shard(module, mesh=self.device_mesh['data_parallel']) to the model (after "
                "parallelize_module), or use data_parallel_size=1."
            )

    # ----- data ---------------------------------------------------------------------------------
    @property
    def distributed_sampler_kwargs(self) -> dict[str, int]:
        """Lightning's name: the sampler's `num_replicas` and `rank`, over the data-parallel ranks."""
        assert self.device_mesh is not None, "the mesh exists once the strategy has launched"
        dp = self.device_mesh["data_parallel"]
        return {"num_replicas": dp.size(), "rank": dp.get_local_rank()}

    def process_dataloader(self, loader: Any, stage: str) -> Any:
        """Each data-parallel rank its shard; the ranks of one tensor-parallel group the same batches."""
        if not self.use_distributed_sampler:
            return loader
        import os

        where = self.distributed_sampler_kwargs
        seed = int(os.environ.get("TANDEM_GLOBAL_SEED", 0))
        overfit = bool(self._overfit_batches)
        return shard_loader(loader, stage, where["rank"], where["num_replicas"], seed, overfit)

    # ----- steps --------------------------------------------------------------------------------
    def _loss_parallel(self, on: bool) -> contextlib.AbstractContextManager[Any]:
        if not on:
            return contextlib.nullcontext()
        from torch.distributed.tensor.parallel import loss_parallel

        return loss_parallel()

    def step(
        self, task: Task, hook: str, batch: Any, batch_idx: int, dataloader_idx: int | None = None
    ) -> Any:
        """The step, inside loss_parallel() when asked; a DTensor loss comes back as a plain tensor (still
        differentiable) and marks its backward to run inside loss_parallel()."""
        with self._loss_parallel(self.loss_parallel):
            out = call_step(getattr(task, hook), batch, batch_idx, dataloader_idx)
        if hook == "training_step":
            self._dtensor_loss = False
        return self._plain(out, hook == "training_step")

    def _plain(self, out: Any, training: bool) -> Any:
        from torch.distributed.tensor import DTensor

        if isinstance(out, DTensor):
            self._dtensor_loss = self._dtensor_loss or training
            return out.full_tensor()  # a collective, as the step itself: every rank is here
        if isinstance(out, dict) and isinstance(out.get("loss"), DTensor):
            return {**out, "loss": self._plain(out["loss"], training)}
        return out

    def backward(
        self, loss: torch.Tensor, sync: bool = True, run: Callable[[torch.Tensor], Any] | None = None
    ) -> None:
        """FSDP's gradient sync toggled on every FSDP module (the task itself need not be one), inside
        loss_parallel() when the step used it."""
        from torch.distributed.tensor import DTensor

        if self.sharded and sync != self._sync:
            from torch.distributed.fsdp import FSDPModule

            for m in self._task.modules():  # type: ignore[union-attr]
                if isinstance(m, FSDPModule):
                    m.set_requires_gradient_sync(sync, recurse=False)
            self._sync = sync
        on = self.loss_parallel or self._dtensor_loss or isinstance(loss, DTensor)
        with self._loss_parallel(on):
            scaled = self.precision.scale(loss)
            scaled.backward() if run is None else run(scaled)  # noqa: B018 (a call, not an expression)
        self._unsynced = self.sharded and not sync and bool(self.units)

    def _check_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """An optimizer must hold the task's parameters as parallelized (plain tensors are allowed: TP leaves
        modules outside its plan whole)."""
        if self._task is None:
            return
        mine = {id(p) for p in self._task.parameters()}
        for group in optimizer.param_groups:
            for p in group["params"]:
                if id(p) not in mine:
                    raise TaskError(
                        f"{type(optimizer).__name__} holds a tensor of shape {tuple(p.shape)} that is not a "
                        "parameter of the task as configure_model parallelized it. Build the optimizer in "
                        "configure_optimizers from self.parameters()."
                    )
