"""What every strategy of one process per device shares: joining (or starting) the process group, and
giving each rank its shard of the data. DDPStrategy and FSDPStrategy build on it."""

from __future__ import annotations

import atexit
import datetime
import gc
import os
import sys
import time
from typing import Any

import torch
import torch.distributed as dist

from strategies import launch
from strategies.base import pick_device
from strategies.comm import ProcessGroupComm
from strategies.heartbeat import Heartbeat
from strategies.multinode import bind_gloo_interface, check_attempt_store, is_multinode
from strategies.parallel import ParallelStrategy
from strategies.precision import Precision
from strategies.sharding import ShardSampler, shard_loader  # noqa: F401 (ShardSampler: re-exported)
from strategies.syncbn import convert_sync_batchnorm
from trainer.errors import ConfigError

LINGER_S = 0.5  # see _destroy_group


def _destroy_group() -> None:
    """Close the default group while the interpreter is whole (registered with atexit).

    Dropping the last reference to a gloo group joins its worker threads (torch releases the GIL for that),
    and each worker first frees the tensors of its last collective, which needs the GIL. A group still
    alive at interpreter shutdown leaves that free to a worker after Python stopped handing out the GIL,
    and the process aborts ("terminate called without an active exception", exit -6) after a good run.
    A group something else still holds (an FSDP model's device mesh) keeps its workers; they get
    `LINGER_S` with the GIL free to finish before shutdown begins.
    """
    if not dist.is_initialized():
        return
    group, gloo = dist.group.WORLD, dist.get_backend() == "gloo"
    dist.destroy_process_group()
    gc.collect()  # the Trainer's cycles may still hold the group, or collectives' Work objects
    if gloo and sys.getrefcount(group) > 2:  # held beyond this frame (and getrefcount's argument)
        time.sleep(LINGER_S)


def _unpin_default_group() -> None:
    """Import torch.distributed.nn before the group exists: its functions take `group=group.WORLD` as a
    default argument, evaluated at import. Imported later (building any torch optimizer imports it through
    torch._dynamo), they would hold the group for the life of the process, and destroy_process_group could
    never close it (see _destroy_group)."""
    import torch.distributed.nn.functional  # noqa: F401


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


class ProcessGroupStrategy(ParallelStrategy):
    """One process per device in a torch.distributed process group; each rank trains on its own shard.

    A plain ``python train.py`` starts `devices` workers through torch's elastic launcher; under torchrun
    or SLURM the process joins the existing group. Subclasses decide how gradients are combined.
    """

    def __init__(
        self,
        accelerator: str | None = None,
        devices: int | None = None,
        precision: Precision | str | int | None = None,
        num_nodes: int | None = None,
        process_group_backend: str | None = None,
        timeout_s: float = 1800.0,
        max_restarts: int = 0,
        sync_batchnorm: bool | None = None,
        peer_timeout_s: float | None = 20.0,
    ) -> None:
        super().__init__(accelerator, precision)
        self.devices, self.num_nodes, self.sync_batchnorm = (
            devices,
            num_nodes,
            sync_batchnorm,
        )  # None: the Trainer's
        self.backend, self.timeout_s, self.max_restarts = process_group_backend, timeout_s, max_restarts
        # multi-node: a rank whose heartbeat is silent this long ends the job (strategies/heartbeat.py)
        self.peer_timeout_s = peer_timeout_s
        self.comm: ProcessGroupComm = ProcessGroupComm(timeout_s, lambda: self._world[0] * self._world[1])

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
        _unpin_default_group()
        store = _attempt_store(timeout)
        if store is None:
            dist.init_process_group(backend, timeout=timeout)
        else:
            dist.init_process_group(
                backend, store=store, rank=self.comm.rank, world_size=self.comm.world_size, timeout=timeout
            )
        atexit.register(_destroy_group)  # before interpreter shutdown: see _destroy_group
        if self.peer_timeout_s and is_multinode():  # one node's agent already sees its own dead workers
            beat = Heartbeat(self.comm.rank, self.comm.world_size, self.peer_timeout_s)
            beat.start()
            atexit.register(beat.stop)  # runs before _destroy_group (atexit is last-in, first-out)

    def setup(self, task: Any) -> None:
        if self.sync_batchnorm:
            convert_sync_batchnorm(task, self.root_device)  # replaces the BatchNorm layers in place
        super().setup(task)

    def teardown(self) -> None:
        if dist.is_initialized():
            self.comm.settle()  # the last stop agreement still in flight

    @property
    def root_device(self) -> torch.device:
        if self._root_device is None:
            self._root_device = pick_device(self.accelerator or "auto", self.comm.local_rank)
        return self._root_device

    # ----- data ---------------------------------------------------------------------------------
    def process_dataloader(self, loader: Any, stage: str) -> Any:
        """Give each rank its shard (strategies/sharding.py): a DistributedSampler for training, an unpadded
        shard for evaluation, in any DataLoader class; in a group of one process too, as Lightning."""
        if not self.use_distributed_sampler:
            return loader
        seed = int(os.environ.get("TANDEM_GLOBAL_SEED", 0))
        overfit = bool(self._overfit_batches)
        return shard_loader(loader, stage, self.comm.rank, self.comm.world_size, seed, overfit)
