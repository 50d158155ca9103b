"""FSDP: one process per device, parameters, gradients and optimizer states sharded across the ranks by
torch's own ``fully_shard`` (FSDP2, DTensor parameters); checkpoints through torch.distributed.checkpoint."""

from __future__ import annotations

import contextlib
import datetime
import warnings
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from strategies.checkpoint.io import ShardedCheckpointIO
from strategies.fault_tolerance.options import FaultTolerance
from strategies.fault_tolerance.replicas import Replicas, fault_tolerant_step
from strategies.fsdp_wrap import check_supported, resolve_classes, shard_task
from strategies.large.activation import checkpoint_modules, checkpointed, resolve_ops
from strategies.large.init import init_context, materialize, recast, sync_replicas
from strategies.large.weights import covered, load_pending
from strategies.precision import Precision
from strategies.precision_plugins import fsdp_param_dtype
from strategies.process_group import ProcessGroupStrategy
from strategies.syncbn import convert_sync_batchnorm
from tandem_core.errors import CheckpointError, ConfigError, TaskError
from tandem_core.rank_zero import TandemDeprecationWarning

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from trainer.task.base import Task


class FSDPStrategy(ProcessGroupStrategy):
    """Fully sharded data parallel: each of N ranks keeps 1/N of every parameter, gradient and optimizer
    state, and all-gathers a unit's parameters only while that unit computes.

    Example::

        Trainer(strategy=FSDPStrategy(wrap=["mymodel.Block"]), devices=4, precision="bf16-mixed").fit(task)

    `wrap` names the module classes that become FSDP units (classes, or "pkg.Class" / "Class" strings);
    without it, every submodule holding at least `min_params` parameters (not counting those of units
    inside it) becomes one. A Task whose ``configure_model()`` calls ``fully_shard`` itself (on the mesh
    ``trainer.strategy.device_mesh``) keeps its own units. The task itself is sharded last, as the root.
    `hybrid=True` with ``num_nodes > 1`` shards within each node and replicates across nodes (HSDP).
    Checkpoints are directories of every rank's shards; `save_full=True` writes one file gathered on
    rank 0 instead. One process falls back to unsharded training, with a notice.
    `activation_checkpointing_policy` (Lightning's: a set of module classes) recomputes those modules'
    activations in backward instead of keeping them; `activation_checkpointing_save_ops` (e.g. ["aten.mm"])
    makes it selective: those ops' outputs are kept (strategies/large/activation.py).
    `fault_tolerance=FaultTolerance(...)` makes this job one replica group of a fault-tolerant job (HSDP with
    in-place recovery): sharded inside the group, the sharded gradients averaged across the live groups through
    torchft after each reduce-scatter (strategies/fault_tolerance/, docs/fault-tolerance.md).
    """

    name = "fsdp"
    fork_start = False  # rank 0's sharded state cannot be handed back to a notebook: scripts only

    def __init__(
        self,
        accelerator: str | None = None,
        devices: int | None = None,
        precision: Precision | str | int | None = None,
        num_nodes: int | None = None,
        wrap: list[type[torch.nn.Module] | str] | None = None,
        min_params: int = 1_000_000,
        reshard_after_forward: bool = True,
        cpu_offload: bool = False,
        hybrid: bool = False,
        save_full: bool = False,
        process_group_backend: str | None = None,
        timeout_s: float = 1800.0,
        max_restarts: int = 0,
        sync_batchnorm: bool | None = None,
        peer_timeout_s: float | None = 20.0,
        start_method: str = "popen",  # the base's; 'fork' (a notebook) is refused at launch: no fork start
        activation_checkpointing_policy: Any = None,
        activation_checkpointing_save_ops: list[Any] | None = None,
        fault_tolerance: FaultTolerance | dict[str, Any] | None = None,
        *,
        cluster_environment: Any = None,
        precision_plugin: Precision | None = None,
        checkpoint_io: Any = None,
        parallel_devices: list[torch.device] | None = None,
        timeout: datetime.timedelta | None = None,
        activation_checkpointing: Any = None,
    ) -> None:
        super().__init__(
            accelerator,
            devices,
            precision,
            num_nodes,
            process_group_backend,
            timeout_s,
            max_restarts,
            sync_batchnorm,
            peer_timeout_s,
            start_method,
            cluster_environment=cluster_environment,
            precision_plugin=precision_plugin,
            checkpoint_io=checkpoint_io,
            parallel_devices=parallel_devices,
            timeout=timeout,
        )
        if min_params < 1:
            raise ConfigError(f"FSDPStrategy(min_params={min_params}) must be at least 1.")
        self.wrap, self.min_params = list(wrap) if wrap is not None else None, min_params
        self.reshard_after_forward, self.cpu_offload, self.hybrid = reshard_after_forward, cpu_offload, hybrid
        self._own_checkpoint_io(_FSDPCheckpointIO(self, full=save_full))
        if activation_checkpointing is not None:  # Lightning's deprecated keyword: module classes
            if activation_checkpointing_policy is not None:
                raise ConfigError(
                    "FSDPStrategy: give activation_checkpointing_policy only (activation_checkpointing is its "
                    "deprecated older form), not both."
                )
            warnings.warn(
                "FSDPStrategy(activation_checkpointing=...) is deprecated (as in Lightning): pass the module "
                "classes as activation_checkpointing_policy={...}.",
                TandemDeprecationWarning,
                stacklevel=2,
            )
            classes = activation_checkpointing
            activation_checkpointing_policy = (
                set(classes) if isinstance(classes, (list, tuple, set)) else {classes}
            )
        if activation_checkpointing_save_ops is not None:
            if activation_checkpointing_policy is None:
                raise ConfigError(
                    "FSDPStrategy(activation_checkpointing_save_ops=...) says which ops selective checkpointing "
                    "keeps, inside the modules activation_checkpointing_policy picks: give that policy too."
                )
            resolve_ops(activation_checkpointing_save_ops)  # a wrong name is an error now
        self.activation_checkpointing_policy = activation_checkpointing_policy
        self.activation_checkpointing_save_ops = activation_checkpointing_save_ops
        self.device_mesh: DeviceMesh | None = None  # set by launch; configure_model may shard on it
        self.units: list[str] = []  # names of the modules that became FSDP units (the root is "")
        self._task: Task | None = None
        self._unsynced = False  # gradients accumulated by backward(sync=False), not reduce-scattered since
        self._sync = True  # the units' current requires_gradient_sync
        # the parameters fully_shard replaced, by id (weakly: a WeakSet would compare tensors with ==)
        self._before_sharding: weakref.WeakValueDictionary[int, torch.Tensor] = weakref.WeakValueDictionary()
        self._checked: set[int] = set()  # optimizers already checked
        self.fault_tolerance = FaultTolerance.of(fault_tolerance)
        if self.fault_tolerance is not None:
            if hybrid:
                raise ConfigError(
                    "FSDPStrategy(hybrid=True, fault_tolerance=...): fault tolerance is the replication across "
                    "groups already (each group shards over its own ranks); drop hybrid=True."
                )
            self.replicas = Replicas(self.fault_tolerance, self)

    @property
    def sharded(self) -> bool:
        """True when the task's parameters are sharded (more than one process)."""
        return self._task is not None and self.comm.world_size > 1

    # ----- life cycle ---------------------------------------------------------------------------
    def launch(self) -> None:  # (no fork start: never returns a ForkStart)
        if self.hybrid and self._world[1] == 1:
            raise ConfigError(
                "FSDPStrategy(hybrid=True) shards within a node and replicates across nodes, but num_nodes=1; "
                "use hybrid=False on one node, or num_nodes > 1."
            )
        super().launch()
        if self.device_mesh is None and self.comm.world_size > 1:
            from torch.distributed.device_mesh import init_device_mesh

            devices, nodes = self._world
            shape, names = (
                ((nodes, devices), ("replicate", "shard"))
                if self.hybrid
                else ((devices * nodes,), ("shard",))
            )
            self.device_mesh = init_device_mesh(self.root_device.type, shape, mesh_dim_names=names)

    def _precision_plugin(self, precision: Precision | str | int) -> Precision:
        """Lightning's FSDPPrecision for a precision name."""
        from strategies.precision_plugins import plugin_for

        return precision if isinstance(precision, Precision) else plugin_for(precision, fsdp=True)

    def setup(self, task: Task) -> None:
        if self.replicas is not None:
            self.replicas.resolve()  # a missing replica group or lighthouse is a ConfigError now
        precision = self.precision.name
        if precision == "16-mixed":
            raise ConfigError(
                "strategy='fsdp' does not support precision='16-mixed' (its gradient scaler cannot see sharded "
                "gradients); use precision='bf16-mixed' (no scaler needed) or '32-true'."
            )
        if self.cpu_offload and self.root_device.type != "cuda":
            raise ConfigError(
                "FSDPStrategy(cpu_offload=True) keeps the shards in host memory while a GPU computes; on "
                f"accelerator={self.root_device.type!r} they are in host memory already: drop cpu_offload."
            )
        check_supported(task)
        if self.wrap:
            resolve_classes(self.wrap, task)  # a wrong name is an error at any world size
        self._task, self._unsynced, self._sync, self._checked = task, False, True, set()
        from torch.distributed.fsdp import FSDPModule

        if self.activation_checkpointing_policy is not None and not checkpointed(task):
            policy, ops = self.activation_checkpointing_policy, self.activation_checkpointing_save_ops
            checkpoint_modules(task, policy, ops)  # before sharding, as torch recommends
        if self.comm.world_size == 1 or isinstance(task, FSDPModule):  # (a later stage: sharded by fit)
            super().setup(task)  # on the device, in the precision's parameter dtype
            if self.comm.world_size == 1 and self.comm.is_global_zero:
                warnings.warn(
                    "strategy='fsdp' runs in one process: there is nothing to shard, so the task trains "
                    "unsharded (as with strategy='single'); checkpoints are still directories.",
                    stacklevel=2,
                )
            return
        # never the whole task on the device: fully_shard moves each unit there as it shards it, and a task
        # built on the meta device gets only its shards allocated, after sharding
        if self.sync_batchnorm:
            convert_sync_batchnorm(task, self.root_device)
        self.precision.setup(self.root_device)
        recast(task, self.precision.param_dtype)  # where it is (meta stays meta)
        self._before_sharding.update((id(p), p) for p in task.parameters())
        assert self.device_mesh is not None
        self.units = shard_task(
            task,
            self.device_mesh,
            wrap=self.wrap,
            min_params=self.min_params,
            reshard_after_forward=self.reshard_after_forward,
            param_dtype=fsdp_param_dtype(precision),
            cpu_offload=self.cpu_offload,
        )
        for p in task.parameters():  # sharded by configure_model already: the same objects, not stale
            self._before_sharding.pop(id(p), None)
        home = torch.device("cpu") if self.cpu_offload else self.root_device
        materialize(task, home, covered(task), sharded=True, replicas=sync_replicas)
        load_pending(task, sharded=True, reader=self.comm.is_global_zero)

    def tensor_init_context(self, empty_init: bool | None = None) -> contextlib.AbstractContextManager[Any]:
        """Lightning's: with `empty_init=True` on the meta device (setup allocates each rank's shards only,
        after sharding); always in the precision's parameter dtype ("true" precisions)."""
        return init_context("meta" if empty_init else None, self.precision.param_dtype)

    # ----- steps --------------------------------------------------------------------------------
    def step(
        self, task: Task, hook: str, batch: Any, batch_idx: int, dataloader_idx: int | None = None
    ) -> Any:
        if hook == "training_step" and self.replicas is not None:
            self.replicas.begin_step()  # this step's quorum (a live peer's state first, if behind)
        return super().step(task, hook, batch, batch_idx, dataloader_idx)

    def backward(
        self, loss: torch.Tensor, sync: bool = True, run: Callable[[torch.Tensor], Any] | None = None
    ) -> None:
        """With sync, each unit's gradients are reduce-scattered as its backward ends; without, they
        accumulate unsharded on every rank (micro-batches 1..k-1 of an accumulation window)."""
        if self.sharded and sync != self._sync:  # toggle only on a change: it walks every unit
            self._task.set_requires_gradient_sync(sync)  # type: ignore[union-attr]
            self._sync = sync
        scaled = self.precision.scale(loss)
        scaled.backward() if run is None else run(scaled)  # noqa: B018 (a call, not an expression)
        self._unsynced = self.sharded and not sync
        if sync and self.replicas is not None:  # HSDP: each shard's gradient averaged across the groups
            from strategies.fault_tolerance.averaging import average_across

            assert self._task is not None and self.replicas.manager is not None
            grads = [p.grad for p in self._task.parameters() if p.grad is not None]
            average_across(
                self.replicas.manager, [g.to_local() if hasattr(g, "to_local") else g for g in grads]
            )

    def optimizer_step(
        self, optimizer: torch.optim.Optimizer, closure: Callable[[], Any] | None = None, **kwargs: Any
    ) -> Any:
        """With fault tolerance the closure (forward, backward, averaging) runs first, the step only if
        committed."""
        if self.replicas is not None:
            return fault_tolerant_step(self, super().optimizer_step, optimizer, closure, **kwargs)
        return super().optimizer_step(optimizer, closure, **kwargs)

    def unscale_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        if id(optimizer) not in self._checked:
            self._check_optimizer(optimizer)
            self._checked.add(id(optimizer))
        if self._unsynced:
            raise TaskError(
                "strategy='fsdp' cannot step on gradients whose last backward skipped synchronization (an "
                "accumulation window cut short by a training loader without a length); give the loader a "
                "length, or set accumulate_grad_batches=1."
            )
        super().unscale_gradients(optimizer)

    def _check_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """An optimizer must hold the sharded parameters: one built before sharding would step nothing."""
        if not self.sharded:
            return
        from torch.distributed.tensor import DTensor

        for group in optimizer.param_groups:
            for p in group["params"]:
                if self._before_sharding.get(id(p)) is p:
                    raise TaskError(
                        f"{type(optimizer).__name__} holds the task's parameters as they were before FSDP "
                        "sharded them, so its steps would change nothing. Build the optimizer in "
                        "configure_optimizers from self.parameters() (the Trainer calls it after sharding); "
                        "do not create it in __init__ or configure_model."
                    )
                if not isinstance(p, DTensor):
                    raise TaskError(
                        f"{type(optimizer).__name__} holds a parameter of shape {tuple(p.shape)} that FSDP did "
                        "not shard (created after the model was set up?). Create every module in __init__ or "
                        "configure_model, and optimize only self.parameters()."
                    )


class _FSDPCheckpointIO(ShardedCheckpointIO):
    """Sharded checkpoints, refusing a save inside an accumulation window (FSDP keeps that window's
    gradients unsharded inside its units, where no checkpoint can reach them)."""

    def __init__(self, strategy: FSDPStrategy, full: bool) -> None:
        super().__init__(full)
        self._strategy = strategy

    @property
    def saves_window_grads(self) -> bool:  # type: ignore[override]
        return not self._strategy.sharded

    def window_grads(self, task: torch.nn.Module) -> list[torch.Tensor | None]:
        if not self.saves_window_grads:
            raise CheckpointError(
                "strategy='fsdp' cannot checkpoint inside a gradient accumulation window; save at optimizer "
                "steps (ModelCheckpoint(every_n_train_steps=...) or per epoch) rather than by time."
            )
        return super().window_grads(task)
