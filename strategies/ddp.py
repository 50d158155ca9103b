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
from strategies.base import pick_device
from strategies.comm import ProcessGroupComm
from strategies.heartbeat import Heartbeat
from strategies.multinode import bind_gloo_interface, check_attempt_store, is_multinode
from strategies.parallel import ParallelStrategy
from strategies.precision import Precision
from strategies.syncbn import convert_sync_batchnorm
from trainer.data import rebuild, rebuildable
from trainer.errors import ConfigError, check_choice

if TYPE_CHECKING:
    from strategies.reducer import Reducer
    from trainer.task import Task


def _destroy_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def _attempt_store(timeout: datetime.timedelta) -> dist.Store | None:
    """Under torch's elastic agent with its shared store, a store whose keys are private to this restart attempt.

    The agent's shared store outlives a restart, and a restarted rank could otherwise read the previous
    attempt's process-group addresses and try to connect to a dead peer (seen here as "Connection refused"
    in Gloo connectFullMesh after a SIGKILL). The attempt key must be the same on every node, and
    TORCHELASTIC_RESTART_COUNT is counted per node, so it is used only on one node (multi-node restarts
    need TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: see multinode.check_attempt_store). None without the
    shared store: rank 0 then hosts a fresh store each attempt and init_process_group's env:// is right.
    """
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if attempt is None or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    check_attempt_store()
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        int(os.environ["WORLD_SIZE"]),
        is_master=False,
        timeout=timeout,
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


class DDPStrategy(ParallelStrategy):
    """Data-parallel training over processes, one device each, with our own gradient reducer.

    Example::

        Trainer(strategy=DDPStrategy(bucket_cap_mb=25, comm_hook="fp16"), devices=2).fit(task)

    A plain ``python train.py`` starts `devices` workers through torch's elastic launcher; under torchrun
    or SLURM the process joins the existing group.
    """

    name = "ddp"

    def __init__(
        self,
        accelerator: str | None = None,
        devices: int | None = None,
        precision: Precision | str | int | None = None,
        num_nodes: int | None = None,
        bucket_cap_mb: float = 25.0,
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
    ) -> None:
        super().__init__(accelerator, precision)
        check_choice("comm_hook", str(comm_hook), ("None", "fp16", "bf16"))
        self.devices, self.num_nodes, self.sync_batchnorm = (
            devices,
            num_nodes,
            sync_batchnorm,
        )  # None: the Trainer's
        self.bucket_cap_mb, self.find_unused_parameters = bucket_cap_mb, find_unused_parameters
        self.gradient_as_bucket_view, self.comm_hook = gradient_as_bucket_view, comm_hook
        self.static_graph, self.broadcast_buffers = static_graph, broadcast_buffers
        self.backend, self.timeout_s, self.max_restarts = process_group_backend, timeout_s, max_restarts
        # multi-node: a rank whose heartbeat is silent this long ends the job (strategies/heartbeat.py)
        self.peer_timeout_s = peer_timeout_s
        self.comm: ProcessGroupComm = ProcessGroupComm(timeout_s)
        self.reducer: Reducer | None = None
        self._unsynced = False  # gradients accumulated by backward(sync=False) and not reduced since

    @property
    def _world(self) -> tuple[int, int]:
        return (self.devices or 1), (self.num_nodes or 1)

    # ----- life cycle ---------------------------------------------------------------------------
    def launch(self) -> None:
        devices, nodes = self._world
        if launch.launched_externally():
            local = int(os.environ.get("LOCAL_WORLD_SIZE", devices))
            if local != devices:
                raise ConfigError(
                    f"this job was launched with {local} processes per node but Trainer has devices={devices};"
                    f" make them agree (e.g. torchrun --nproc_per_node={devices}, or devices={local})."
                )
        elif nodes > 1:
            raise ConfigError(
                f"num_nodes={nodes} needs a multi-node launcher: start the script with "
                "torchrun (--nnodes, --rdzv-endpoint) or srun on every node."
            )
        elif devices == 1:  # a group of one, in this process
            os.environ.update(
                RANK="0",
                WORLD_SIZE="1",
                LOCAL_RANK="0",
                LOCAL_WORLD_SIZE="1",
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(launch._free_port()),
            )
        else:
            launch.relaunch(devices, self.max_restarts)  # the parent exits with the workers' status
        self._join_group()

    def _join_group(self) -> None:
        device = pick_device(self.accelerator or "auto", self.comm.local_rank)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        self._root_device = device
        self.comm.device = device if device.type == "cuda" else torch.device("cpu")  # NCCL needs GPU tensors
        if dist.is_initialized():
            return
        backend = self.backend or ("nccl" if device.type == "cuda" else "gloo")
        timeout = datetime.timedelta(seconds=self.timeout_s)
        if backend == "gloo":
            bind_gloo_interface()
        store = _attempt_store(timeout)
        if store is None:
            dist.init_process_group(backend, timeout=timeout)
        else:
            dist.init_process_group(
                backend, store=store, rank=self.comm.rank, world_size=self.comm.world_size, timeout=timeout
            )
        # A group left to interpreter shutdown can abort the process ("terminate called without an
        # active exception", exit -6) after a successful run: close the one we opened, in order.
        atexit.register(_destroy_group)
        if self.peer_timeout_s and is_multinode():  # one node's agent already sees its own dead workers
            beat = Heartbeat(self.comm.rank, self.comm.world_size, self.peer_timeout_s)
            beat.start()
            atexit.register(beat.stop)  # runs before _destroy_group (atexit is last-in, first-out)

    @property
    def root_device(self) -> torch.device:
        if self._root_device is None:
            self._root_device = pick_device(self.accelerator or "auto", self.comm.local_rank)
        return self._root_device

    def setup(self, task: Task) -> None:
        from strategies.reducer import Reducer

        if self.sync_batchnorm:
            convert_sync_batchnorm(task, self.root_device)  # replaces the BatchNorm layers in place
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
        self._unsynced = False

    def teardown(self) -> None:
        if dist.is_initialized():
            self.comm.settle()
        if self.reducer is not None:  # kept (without hooks) so that its bucket statistics can be read
            self.reducer.remove_hooks()

    # ----- data ---------------------------------------------------------------------------------
    def process_dataloader(self, loader: Any, stage: str) -> Any:
        """Give each rank its shard: DistributedSampler for training, an unpadded shard for evaluation."""
        world, rank = self.comm.world_size, self.comm.rank
        if not self.use_distributed_sampler or world == 1 or not rebuildable(loader):
            return loader
        sampler = loader.sampler
        if isinstance(sampler, (DistributedSampler, ShardSampler)) or loader.batch_size is None:
            return loader  # the user already shards, or batches with a custom batch_sampler
        if stage == "train":
            sampler = DistributedSampler(
                loader.dataset,
                num_replicas=world,
                rank=rank,
                shuffle=isinstance(sampler, RandomSampler),
                seed=int(os.environ.get("TANDEM_GLOBAL_SEED", 0)),
                drop_last=loader.drop_last,
            )
        else:
            sampler = ShardSampler(len(loader.dataset), rank, world)
        return rebuild(loader, sampler=sampler)

    # ----- steps --------------------------------------------------------------------------------
    def step(
        self, task: Task, hook: str, batch: Any, batch_idx: int, dataloader_idx: int | None = None
    ) -> Any:
        if hook == "training_step" and self.broadcast_buffers and self.reducer is not None:
            self.comm.run("buffer broadcast", self.reducer.sync_buffers)
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

    def _average_grads_now(self) -> None:
        """Average the locally accumulated gradients in one flat all-reduce (end of an unknown-length epoch)."""
        assert self.reducer is not None
        params = [p for p in self.reducer.params if p.grad is not None]
        if not params:
            return
        flat = torch.cat([p.grad.reshape(-1).to(torch.float64) for p in params])
        dist.all_reduce(flat)
        flat /= self.comm.world_size
        offset = 0
        for p in params:
            n = p.grad.numel()
            p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
            offset += n
