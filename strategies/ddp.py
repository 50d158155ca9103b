"""DDP: one process per device, gradients averaged by our bucketed-overlap Reducer (strategies/reducer.py)."""

from __future__ import annotations

import atexit
import contextlib
import datetime
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch.utils.data import DistributedSampler, RandomSampler, Sampler

from strategies import launch
from strategies.base import Strategy
from strategies.precision import Precision
from strategies.single import pick_device
from trainer.data import rebuild, rebuildable
from trainer.errors import ConfigError, DistributedError, choose

if TYPE_CHECKING:
    from strategies.reducer import Reducer
    from trainer.task import Task

_OPS = {
    "sum": dist.ReduceOp.SUM,
    "mean": dist.ReduceOp.SUM,
    "max": dist.ReduceOp.MAX,
    "min": dist.ReduceOp.MIN,
}


def _destroy_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def _attempt_store(timeout: datetime.timedelta) -> dist.Store | None:
    """Under torch's elastic agent, a store whose keys are private to this restart attempt.

    The agent's store outlives a restart, and a restarted rank could otherwise read the previous attempt's
    process-group addresses and try to connect to a dead peer (seen here as "Connection refused" in
    Gloo connectFullMesh after a SIGKILL). None outside the agent: init_process_group's env:// is fine.
    """
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if attempt is None:
        return None
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        int(os.environ["WORLD_SIZE"]),
        is_master=not agent_store and os.environ.get("RANK") == "0",
        timeout=timeout,
        multi_tenant=not agent_store,
    )
    return dist.PrefixStore(f"tandem/attempt_{attempt}", store)


class ShardSampler(Sampler[int]):
    """Evaluation sampler: rank r takes every world_size-th index from r, no padding and no repeats,
    so metrics over all ranks count each sample exactly once (ranks may get one batch more or less)."""

    def __init__(self, length: int, rank: int, world_size: int) -> None:
        self.indices = range(rank, length, world_size)

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


class DDPStrategy(Strategy):
    """Data-parallel training over processes, one device each, with our own gradient reducer.

    Example::

        Trainer(strategy=DDPStrategy(bucket_cap_mb=25, comm_hook="fp16"), devices=2).fit(task)

    A plain ``python train.py`` starts `devices` workers through torch's elastic launcher; under torchrun
    or SLURM the process joins the existing group.
    """

    name = "ddp"

    def __init__(
        self,
        accelerator: str = "auto",
        devices: int = 1,
        precision: Precision | str | int = "32-true",
        num_nodes: int = 1,
        bucket_cap_mb: float = 25.0,
        find_unused_parameters: bool = False,
        gradient_as_bucket_view: bool = True,
        comm_hook: str | None = None,
        static_graph: bool = False,
        broadcast_buffers: bool = True,
        process_group_backend: str | None = None,
        timeout_s: float = 1800.0,
        max_restarts: int = 0,
    ) -> None:
        super().__init__(accelerator, precision)
        choose("comm_hook", str(comm_hook), ("None", "fp16", "bf16"))
        self.devices, self.num_nodes = devices, num_nodes
        self.bucket_cap_mb, self.find_unused_parameters = bucket_cap_mb, find_unused_parameters
        self.gradient_as_bucket_view, self.comm_hook = gradient_as_bucket_view, comm_hook
        self.static_graph, self.broadcast_buffers = static_graph, broadcast_buffers
        self.backend, self.timeout_s, self.max_restarts = process_group_backend, timeout_s, max_restarts
        self.reducer: Reducer | None = None
        self._syncing = True
        self._synced_backward = False  # the last backward ran with the reducer's hooks armed
        self._step_join = False  # per-step agreement on "every rank still has a batch" (unknown lengths)
        self.stop_check_interval = 10  # optimizer steps between agreements on a stop request (SIGTERM)

    # ----- where we are -------------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return int(os.environ.get("WORLD_SIZE", self.devices * self.num_nodes))

    @property
    def global_rank(self) -> int:
        return int(os.environ.get("RANK", 0))

    @property
    def local_rank(self) -> int:
        return int(os.environ.get("LOCAL_RANK", 0))

    # ----- life cycle ---------------------------------------------------------------------------
    def launch(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if launch.launched_externally():
            local = int(os.environ.get("LOCAL_WORLD_SIZE", self.devices))
            if local != self.devices:
                raise ConfigError(
                    f"this job was launched with {local} processes per node but Trainer has devices={self.devices};"
                    f" make them agree (e.g. torchrun --nproc_per_node={self.devices}, or devices={local})."
                )
            return fn(*args, **kwargs)
        if self.num_nodes > 1:
            raise ConfigError(
                f"num_nodes={self.num_nodes} needs a multi-node launcher: start the script with "
                "torchrun (--nnodes, --rdzv-endpoint) or srun on every node."
            )
        if self.devices == 1:  # a group of one, in this process
            os.environ.update(
                RANK="0",
                WORLD_SIZE="1",
                LOCAL_RANK="0",
                LOCAL_WORLD_SIZE="1",
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(launch._free_port()),
            )
            return fn(*args, **kwargs)
        launch.relaunch(self.devices, self.max_restarts)

    def setup_environment(self) -> None:
        device = pick_device(self.accelerator, self.local_rank)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        self._root_device = device
        if not dist.is_initialized():
            backend = self.backend or ("nccl" if device.type == "cuda" else "gloo")
            timeout = datetime.timedelta(seconds=self.timeout_s)
            store = _attempt_store(timeout)
            if store is None:
                dist.init_process_group(backend, timeout=timeout)
            else:
                dist.init_process_group(
                    backend, store=store, rank=self.global_rank, world_size=self.world_size, timeout=timeout
                )
            # A group left to interpreter shutdown can abort the process ("terminate called without an
            # active exception", exit -6) after a successful run: close the one we opened, in order.
            atexit.register(_destroy_group)

    def setup(self, task: Task) -> None:
        from strategies.reducer import Reducer

        super().setup(task)
        if self.reducer is not None:
            self.reducer.remove_hooks()
        self.reducer = Reducer(
            task,
            bucket_cap_mb=self.bucket_cap_mb,
            gradient_as_bucket_view=self.gradient_as_bucket_view,
            find_unused_parameters=self.find_unused_parameters,
            comm_hook=self.comm_hook,
            broadcast_buffers=self.broadcast_buffers,
            static_graph=self.static_graph,
        )

    def teardown(self) -> None:
        if self.reducer is not None:  # kept (without hooks) so that its bucket statistics can be read
            self.reducer.remove_hooks()

    # ----- data ---------------------------------------------------------------------------------
    def process_dataloader(self, loader: Any, stage: str) -> Any:
        """Give each rank its shard: DistributedSampler for training, an unpadded shard for evaluation."""
        if not self.use_distributed_sampler or self.world_size == 1 or not rebuildable(loader):
            return loader
        sampler = loader.sampler
        if isinstance(sampler, (DistributedSampler, ShardSampler)) or loader.batch_size is None:
            return loader  # the user already shards, or batches with a custom batch_sampler
        if stage == "train":
            sampler = DistributedSampler(
                loader.dataset,
                num_replicas=self.world_size,
                rank=self.global_rank,
                shuffle=isinstance(sampler, RandomSampler),
                seed=int(os.environ.get("TANDEM_GLOBAL_SEED", 0)),
                drop_last=loader.drop_last,
            )
        else:
            sampler = ShardSampler(len(loader.dataset), self.global_rank, self.world_size)
        return rebuild(loader, sampler=sampler)

    # ----- steps --------------------------------------------------------------------------------
    def training_step(self, task: Task, batch: Any, batch_idx: int) -> Any:
        if self.broadcast_buffers and self.reducer is not None:
            self._collective("buffer broadcast", self.reducer.sync_buffers)
        return task.training_step(batch, batch_idx)

    def no_sync(self, enabled: bool = True) -> contextlib.AbstractContextManager[Any]:
        if enabled and self.reducer is not None:
            return self._no_sync()
        return self._nullcontext

    @contextlib.contextmanager
    def _no_sync(self) -> Iterator[None]:
        assert self.reducer is not None
        self._syncing = False
        try:
            with self.reducer.no_sync():
                yield
        finally:
            self._syncing = True

    def backward(self, loss: torch.Tensor) -> None:
        if self.reducer is not None and self._syncing:
            self.reducer.prepare_for_backward(loss)
        self._synced_backward = self._syncing
        self.precision.backward(loss)

    def optimizer_step(self, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
        if self.reducer is not None:
            if self._synced_backward:  # wait for the buckets still in flight and average
                self._collective("gradient all-reduce", self.reducer.finalize)
            else:  # the data ended inside an accumulation window whose last backward skipped sync
                self._collective("gradient all-reduce", self._average_grads_now)
            self._synced_backward = False
        return super().optimizer_step(optimizer, *args, **kwargs)

    def _average_grads_now(self) -> None:
        """Average the locally accumulated gradients in one flat all-reduce (end of an unknown-length epoch)."""
        assert self.reducer is not None
        params = [p for p in self.reducer.params if p.grad is not None]
        if not params:
            return
        flat = torch.cat([p.grad.reshape(-1).to(torch.float64) for p in params])
        dist.all_reduce(flat)
        flat /= self.world_size
        offset = 0
        for p in params:
            n = p.grad.numel()
            p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
            offset += n

    # ----- agreement between ranks --------------------------------------------------------------
    def agree_num_batches(self, n: int | float) -> int | float:
        """Every rank runs the shortest rank's epoch (one all-gather per epoch), so uneven loaders
        cannot leave a rank waiting in a collective; with an unknown length (an IterableDataset) the
        ranks agree batch by batch instead (see `join`)."""
        unknown = -1
        mine = torch.tensor([unknown if n == float("inf") else int(n)], dtype=torch.int64)
        lengths = self.all_gather(mine).view(-1).tolist()
        self._step_join = unknown in lengths
        known = [v for v in lengths if v != unknown]
        return min(known) if known else float("inf")

    def join(self, has_batch: bool) -> bool:
        """True while every rank still has a batch; a 1-element all-reduce per step, only for unknown lengths."""
        if not self._step_join:
            return has_batch
        return not self._any(not has_batch, "join all-reduce")

    def any_rank(self, flag: bool) -> bool:
        return self._any(flag, "stop-request all-reduce")

    def _any(self, flag: bool, op: str) -> bool:
        """True if `flag` is set on any rank: a 1-element MAX all-reduce."""
        flag_t = torch.tensor([1 if flag else 0], dtype=torch.int32)
        self._collective(op, dist.all_reduce, flag_t, dist.ReduceOp.MAX)
        return bool(flag_t.item())

    def _collective(self, op: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Run a collective; a timeout becomes a DistributedError naming this rank and the operation."""
        try:
            return fn(*args)
        except RuntimeError as e:
            text = str(e).lower()
            if (
                "timed out" in text
                or "timeout" in text
                or "connection closed" in text
                or "pair closure" in text
            ):
                raise DistributedError(
                    f"rank {self.global_rank}/{self.world_size}: {op} did not complete within timeout_s="
                    f"{self.timeout_s:g}s ({e}). Another rank has probably failed or is stuck: look at its "
                    "output; raise DDPStrategy(timeout_s=...) if its steps are legitimately this slow."
                ) from e
            raise

    # ----- collectives --------------------------------------------------------------------------
    def reduce(self, tensor: torch.Tensor, op: str = "mean") -> torch.Tensor:
        choose("reduce op", op, tuple(_OPS))
        out = tensor.detach().clone()
        self._collective(f"{op} all-reduce", dist.all_reduce, out, _OPS[op])
        return out / self.world_size if op == "mean" else out

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        parts = [torch.empty_like(tensor) for _ in range(self.world_size)]
        self._collective("all-gather", dist.all_gather, parts, tensor.contiguous())
        return torch.stack(parts)

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        box = [obj]
        self._collective("broadcast", dist.broadcast_object_list, box, src)
        return box[0]

    def gather_object(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.world_size
        self._collective("object all-gather", dist.all_gather_object, out, obj)
        return out

    def barrier(self, name: str | None = None) -> None:
        if dist.is_initialized():
            self._collective(f"barrier{f' ({name})' if name else ''}", dist.barrier)
