"""DDP: one process per device, gradients averaged by our bucketed-overlap Reducer (strategies/reducer.py)."""

from __future__ import annotations

import contextlib
import datetime
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from strategies.comm_device import to_comm
from strategies.fault_tolerance.options import FaultTolerance
from strategies.fault_tolerance.replicas import Replicas, fault_tolerant_step
from strategies.precision import Precision
from strategies.process_group import ProcessGroupStrategy, ShardSampler
from tandem_core.errors import ConfigError, check_choice
from tandem_core.rank_zero import TandemDeprecationWarning

if TYPE_CHECKING:
    from strategies.compiled import BucketSplits
    from strategies.reducer import Reducer
    from trainer.task.base import Task

__all__ = ["DDPStrategy", "ShardSampler"]


class DDPStrategy(ProcessGroupStrategy):
    """Data-parallel training over processes, one device each, with our own gradient reducer.

    Example::

        Trainer(strategy=DDPStrategy(bucket_cap_mb=25, comm_hook="fp16"), devices=2).fit(task)
        Trainer(strategy=DDPStrategy(zero=1), devices=4).fit(task)  # ZeRO-1: optimizer states sharded

    `zero=1` (strategy="ddp_zero1") shards the optimizer states over the ranks with torch's
    ZeroRedundancyOptimizer after the Reducer averaged the gradients (strategies/zero.py).

    `fault_tolerance=FaultTolerance(...)` makes this job one replica group of a job that keeps training
    through failures: each bucket is averaged inside the group, then across the live groups through torchft;
    a failed group rejoins from a live peer (strategies/fault_tolerance/, docs/fault-tolerance.md).

    A plain ``python train.py`` starts `devices` workers through torch's elastic launcher; under torchrun
    or SLURM the process joins the existing group. In a notebook, or with ``start_method="fork"``
    (strategy="ddp_notebook"/"ddp_fork"), the workers are forked from this process (strategies/fork.py).
    """

    name = "ddp"

    def __init__(
        self,
        accelerator: str | None = None,
        devices: int | None = None,
        precision: Precision | str | int | None = None,
        num_nodes: int | None = None,
        bucket_cap_mb: float | str = 25.0,
        find_unused_parameters: bool = False,
        gradient_as_bucket_view: bool = True,
        comm_hook: str | None = None,
        static_graph: bool = False,
        broadcast_buffers: bool = True,
        process_group_backend: str | None = None,
        timeout_s: float = 1800.0,
        max_restarts: int = 0,
        sync_batchnorm: bool | None = None,
        peer_timeout_s: float | None = 20.0,
        start_method: str = "popen",
        zero: int = 0,
        fault_tolerance: FaultTolerance | dict[str, Any] | None = None,
        *,
        cluster_environment: Any = None,
        precision_plugin: Precision | None = None,
        checkpoint_io: Any = None,
        parallel_devices: list[torch.device] | None = None,
        timeout: datetime.timedelta | None = None,
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
        check_choice("comm_hook", str(comm_hook), ("None", "fp16", "bf16"))
        if zero not in (0, 1):
            raise ConfigError(
                f"DDPStrategy(zero={zero!r}): zero is 0 (off) or 1 (optimizer states sharded, ZeRO-1); for "
                "gradients and parameters sharded too (ZeRO-2/3) use strategy='fsdp'."
            )
        self.zero = int(zero)
        if self.zero:  # ZeRO-1: optimizer states sharded over the ranks (strategies/zero.py)
            from strategies.zero import ShardedOptimizers, ZeroCheckpointIO

            self.sharded_optimizers = ShardedOptimizers()
            self._own_checkpoint_io(ZeroCheckpointIO(self.sharded_optimizers, self.comm))
        if isinstance(bucket_cap_mb, str):  # "auto": the Reducer measures and picks (strategies/costmodel.py)
            check_choice("bucket_cap_mb", bucket_cap_mb, ("auto",))
        self.bucket_cap_mb, self.find_unused_parameters = bucket_cap_mb, find_unused_parameters
        self.gradient_as_bucket_view, self.comm_hook = gradient_as_bucket_view, comm_hook
        self.static_graph, self.broadcast_buffers = static_graph, broadcast_buffers
        self.fault_tolerance = FaultTolerance.of(fault_tolerance)
        if self.fault_tolerance is not None:
            self._check_fault_tolerance()
            self.replicas = Replicas(self.fault_tolerance, self)
        self.reducer: Reducer | None = None
        self._splits: BucketSplits | None = None  # set while the task is compiled (strategies/compiled.py)
        self._unsynced = False  # gradients accumulated by backward(sync=False) and not reduced since

    @property
    def is_distributed(self) -> bool:
        """Always True; deprecated, as in Lightning (a DDPStrategy is distributed by definition)."""
        warnings.warn(
            f"`{type(self).__name__}.is_distributed` is deprecated (as in Lightning) and always True.",
            TandemDeprecationWarning,
            stacklevel=2,
        )
        return True

    def _check_fault_tolerance(self) -> None:
        refused = {
            "zero=1": self.zero,
            "bucket_cap_mb='auto'": self.bucket_cap_mb == "auto",
            "find_unused_parameters=True": self.find_unused_parameters,
        }
        for what, on in refused.items():
            if on:
                raise ConfigError(
                    f"DDPStrategy(fault_tolerance=...) does not support {what}: every replica group must "
                    "fill the same buckets in the same order and average them the same way; drop one of them."
                )

    def setup(self, task: Task) -> None:
        if self.replicas is not None:
            self.replicas.resolve()  # a missing replica group or lighthouse is a ConfigError now
        if self.zero and self.precision.name == "16-mixed":
            raise ConfigError(
                "DDPStrategy(zero=1) does not support precision='16-mixed' (the gradient scaler steps the whole "
                "optimizer); use precision='bf16-mixed' or '32-true', or zero=0."
            )
        super().setup(task)
        self._build_reducer(task)

    def parameters_changed(self, task: Task) -> None:
        """Some parameters started or stopped requiring gradients (a finetuning callback unfroze a backbone):
        reduce exactly those from now on. Called between optimizer steps."""
        if (
            self.reducer is not None
            and [p for p in task.parameters() if p.requires_grad] != self.reducer.params
        ):
            self._build_reducer(task)

    def _build_reducer(self, task: Task) -> None:
        from strategies.reducer import Reducer

        if self.reducer is not None:
            self.reducer.remove_hooks()
        cross = None
        if self.replicas is not None:  # buckets averaged across replica groups too, in a fixed layout
            from strategies.fault_tolerance.averaging import CrossGroup

            replicas = self.replicas
            cross = CrossGroup(lambda: replicas.manager, None, self.comm.world_size)  # type: ignore[arg-type,return-value]
        self.reducer = Reducer(
            task,
            rebuild_buckets=cross is None,
            cross_group=cross,
            bucket_cap_mb=self.bucket_cap_mb,
            gradient_as_bucket_view=self.gradient_as_bucket_view,
            find_unused_parameters=self.find_unused_parameters,
            comm_hook=self.comm_hook,
            broadcast_buffers=self.broadcast_buffers,
            static_graph=self.static_graph,
            device=self.comm.device,
        )
        self._unsynced = False

    def compile(self, task: Task, apply: Callable[[Task], Callable[[], None]]) -> Callable[[], None]:
        """Compile, keeping the overlap: the compiled graphs are split at the Reducer's bucket size."""
        from strategies.compiled import BucketSplits, splits_unavailable

        assert self.reducer is not None
        reason = splits_unavailable()
        if reason is not None:
            warnings.warn(
                f"{reason}: compiled backward graphs are not split at bucket boundaries, so every gradient "
                "all-reduce waits for the end of backward (no overlap).",
                UserWarning,
                stacklevel=2,
            )
        else:
            self._splits = BucketSplits(self.reducer.bucket_bytes_cap)
        undo = apply(task)

        def uncompile() -> None:
            self._splits = None
            undo()

        return uncompile

    def teardown(self) -> None:
        super().teardown()
        if self.reducer is not None:  # kept (without hooks) so that its bucket statistics can be read
            self.reducer.remove_hooks()

    # ----- steps --------------------------------------------------------------------------------
    def step(
        self, task: Task, hook: str, batch: Any, batch_idx: int, dataloader_idx: int | None = None
    ) -> Any:
        if hook == "training_step" and self.replicas is not None:
            self.replicas.begin_step()  # this step's quorum (a live peer's state first, if behind)
        if hook == "training_step" and self.broadcast_buffers and self.reducer is not None:
            self.comm.run("buffer broadcast", self.reducer.sync_buffers)
        if self._splits is not None:
            with self._splits:
                return super().step(task, hook, batch, batch_idx, dataloader_idx)
        return super().step(task, hook, batch, batch_idx, dataloader_idx)

    def backward(
        self, loss: torch.Tensor, sync: bool = True, run: Callable[[torch.Tensor], Any] | None = None
    ) -> None:
        """With sync, buckets are all-reduced while backward runs and averaged when it ends (gradients
        are final afterwards, as with torch's DDP); without, they only accumulate locally."""
        reducer, scaled = self.reducer, self.precision.scale(loss)
        if reducer is not None and sync:
            reducer.prepare_for_backward(loss)
        with reducer.no_sync() if reducer is not None and not sync else contextlib.nullcontext():
            scaled.backward() if run is None else run(scaled)  # noqa: B018 (a call, not an expression)
        if reducer is not None and sync:
            self.comm.run("gradient all-reduce", reducer.finalize)
        self._unsynced = reducer is not None and not sync

    def unscale_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        if self._unsynced:  # the data ended inside an accumulation window whose last backward skipped sync
            self.comm.run("gradient all-reduce", self._average_grads_now)
            self._unsynced = False
        super().unscale_gradients(optimizer)

    def optimizer_step(
        self, optimizer: torch.optim.Optimizer, closure: Callable[[], Any] | None = None, **kwargs: Any
    ) -> Any:
        """With zero=1, the optimizer's ZeRO twin steps this rank's share and broadcasts it. With fault
        tolerance the closure (forward, backward, averaging) runs first and the step only if committed."""
        if self.replicas is not None:
            return fault_tolerant_step(self, super().optimizer_step, optimizer, closure, **kwargs)
        if self.zero:
            return self.sharded_optimizers.step(optimizer, closure, **kwargs)
        return super().optimizer_step(optimizer, closure, **kwargs)

    def _average_grads_now(self) -> None:
        """Average the locally accumulated gradients in one flat all-reduce (end of an unknown-length epoch)."""
        assert self.reducer is not None
        params = [p for p in self.reducer.params if p.grad is not None]
        if not params:
            return
        flat = to_comm(torch.cat([p.grad.reshape(-1).to(torch.float64) for p in params]), self.comm.device)
        dist.all_reduce(flat)
        flat /= self.comm.world_size
        offset = 0
        for p in params:
            n = p.grad.numel()
            p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
            offset += n
