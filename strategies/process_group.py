"""What every strategy of one process per device shares: joining (or starting) the process group, and
giving each rank its shard of the data. DDPStrategy and FSDPStrategy build on it."""

from __future__ import annotations

import atexit
import datetime
import os
import sys
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from strategies import attempt, fork, group_exit, launch, slurm
from strategies.accelerators import by_name
from strategies.base import pick_device
from strategies.comm import ProcessGroupComm
from strategies.comm_device import comm_device
from strategies.environments.base import ClusterEnvironment
from strategies.environments.detect import detect as detect_environment
from strategies.fork import ForkStart
from strategies.heartbeat import Heartbeat
from strategies.layer_sync import LayerSync, TorchSyncBatchNorm
from strategies.multinode import bind_gloo_interface, is_multinode
from strategies.parallel import ParallelStrategy
from strategies.precision import Precision
from strategies.sharding import ShardSampler, shard_loader  # noqa: F401 (ShardSampler: re-exported)
from tandem_core.errors import ConfigError, LaunchError

if TYPE_CHECKING:
    from strategies.fault_tolerance.replicas import Replicas


def _unpin_default_group() -> None:
    """Import torch.distributed.nn before the group exists: its functions take `group=group.WORLD` as a
    default argument, evaluated at import. Imported later (building any torch optimizer imports it through
    torch._dynamo), they would hold the group for the life of the process, and destroy_process_group could
    never close it before exit (see strategies/group_exit.py, which unpins a group made before Tandem could
    do this)."""
    import torch.distributed.nn.functional  # noqa: F401


#: torch's NCCL error handling mode 2 ("CleanUpOnly"): on a collective's timeout or a peer's NCCL error the
#: watchdog aborts the communicator and the process lives on, so the rank's next wait or collective raises
#: (a DistributedError naming the operation: ProcessGroupComm.translate). torch's default (3) tears the
#: process down from the watchdog thread instead, with no Python error and no checkpoint hook.
NCCL_ERROR_HANDLING = "2"


def nccl_error_handling() -> None:
    """Before an NCCL group is made: a failed or timed-out collective becomes an error in this process within
    timeout_s (TORCH_NCCL_ASYNC_ERROR_HANDLING, unless the user set it)."""
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", NCCL_ERROR_HANDLING)


def _attempt_store(timeout: datetime.timedelta) -> tuple[dist.Store, str] | None:
    """Under torch's elastic agent with its shared store, (a store whose keys are private to this start of
    the workers, that prefix); None without the shared store: rank 0 then hosts a fresh store each start
    and init_process_group's env:// is right. See strategies/attempt.py for why and how."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        int(os.environ["WORLD_SIZE"]),
        is_master=False,
        timeout=timeout,
    )
    token = attempt.agree(store, int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), timeout)
    prefix = f"{attempt.KEY}/{token}"
    return dist.PrefixStore(prefix, store), prefix


#: how the workers start: 'popen' re-runs the script once per device (as torchrun does); the others start them
#: from this process with multiprocessing (Lightning's ddp_fork/ddp_notebook, ddp_spawn) and bring rank 0's
#: results back to it (strategies/fork.py)
START_METHODS = ("popen", "fork", "spawn", "forkserver")


def check_start_method(method: str) -> None:
    """Refuse a start method Tandem does not have, listing those it has."""
    if method not in START_METHODS:
        valid = ", ".join(repr(m) for m in START_METHODS)
        raise ConfigError(f"start_method must be one of {valid}, got {method!r}")


def _device_kind(devices: list[torch.device]) -> str:
    """The one device type of Lightning's `parallel_devices` (a mix of types is refused)."""
    kinds = {torch.device(d).type for d in devices}
    if len(kinds) != 1:
        raise ConfigError(f"parallel_devices must all be of one device type, got {devices}")
    return kinds.pop()


class ProcessGroupStrategy(ParallelStrategy):
    """One process per device in a torch.distributed process group; each rank trains on its own shard.

    A plain ``python train.py`` starts `devices` workers through torch's elastic launcher; under torchrun
    or SLURM the process joins the existing group; in a notebook the workers are forked (strategies/fork.py).
    Subclasses decide how gradients are combined.
    """

    fork_start = True  # can run a stage in forked workers (a notebook's start)

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
        start_method: str = "popen",
        *,
        cluster_environment: ClusterEnvironment | None = None,
        precision_plugin: Precision | None = None,
        checkpoint_io: Any = None,
        parallel_devices: list[torch.device] | None = None,
        timeout: datetime.timedelta | None = None,
    ) -> None:
        if timeout is not None:  # Lightning's keyword: the same limit as a timedelta
            if timeout_s != 1800.0 and timeout_s != timeout.total_seconds():
                raise ConfigError(f"timeout={timeout!r} and timeout_s={timeout_s} disagree: give one of them")
            timeout_s = timeout.total_seconds()
        if parallel_devices:  # Lightning's keyword: one device per process on this node
            kind = _device_kind(parallel_devices)
            named = by_name(accelerator)  # an Accelerator object (CPUAccelerator()) as its name
            if named is not None and {"gpu": "cuda"}.get(str(named), named) != kind:
                raise ConfigError(
                    f"parallel_devices on {kind} but accelerator={accelerator!r}: choose one device type"
                )
            accelerator, devices = kind, devices if devices is not None else len(parallel_devices)
        super().__init__(
            accelerator, precision, precision_plugin=precision_plugin, checkpoint_io=checkpoint_io
        )
        check_start_method(start_method)
        self.start_method, self._parallel_devices = start_method, parallel_devices
        self.devices, self.num_nodes, self.sync_batchnorm = (
            devices,
            num_nodes,
            sync_batchnorm,
        )  # None: the Trainer's
        self.backend, self.timeout_s, self.max_restarts = process_group_backend, timeout_s, max_restarts
        # multi-node: a rank whose heartbeat is silent this long ends the job (strategies/heartbeat.py)
        self.peer_timeout_s = peer_timeout_s
        self._alone = False  # a group of one made here (launch)
        self.comm: ProcessGroupComm = ProcessGroupComm(timeout_s, self._planned_world)
        # in-place fault tolerance (DDPStrategy/FSDPStrategy(fault_tolerance=...)): this job is one replica
        # group of several (strategies/fault_tolerance/)
        self.replicas: Replicas | None = None
        # where the processes come from and their ranks (None: the Trainer's plugin, else detected)
        self.cluster_environment = cluster_environment
        self.layer_sync: LayerSync | None = None  # the Trainer's (sync_batchnorm=True: TorchSyncBatchNorm)

    @property
    def cluster_environment(self) -> ClusterEnvironment | None:
        """The cluster environment (Lightning's attribute): where the processes come from, their ranks."""
        return self.comm.environment

    @cluster_environment.setter
    def cluster_environment(self, env: ClusterEnvironment | None) -> None:
        self.comm.environment = env

    def set_world_ranks(self) -> None:
        """Tell the environment this job's size and this process's rank (devices x num_nodes, node rank x
        devices + local rank); environments that read them from their scheduler ignore it."""
        env = self.cluster_environment
        if env is not None:
            devices, nodes = self._world
            env.set_global_rank(env.node_rank() * devices + env.local_rank())
            env.set_world_size(devices * nodes)

    @property
    def launcher(self) -> launch.Launcher:
        """How this strategy starts its workers: a notebook forks them (popen and fork), spawn pickles them."""
        forks = self.fork_start and self.start_method in ("popen", "fork")
        return launch.Launcher(self.start_method, forks)

    @property
    def num_processes(self) -> int:
        """Processes per node (Lightning's name; the Trainer's devices)."""
        return self._world[0]

    @property
    def parallel_devices(self) -> list[torch.device]:
        """The device of each process on this node (Lightning's attribute): as given, else the accelerator's."""
        if self._parallel_devices:
            return list(self._parallel_devices)
        device = pick_device(self.accelerator or "auto")
        if device.type == "cuda":
            return [torch.device("cuda", i) for i in range(self.num_processes)]
        return [device] * self.num_processes

    @parallel_devices.setter
    def parallel_devices(self, devices: list[torch.device]) -> None:
        """Lightning's setter: one process per given device on this node, on their device type."""
        self.accelerator, self.devices, self._root_device = _device_kind(devices), len(devices), None
        self._parallel_devices = list(devices)

    @property
    def node_rank(self) -> int:
        """This node's index in the job."""
        env = self.cluster_environment
        if env is not None and "RANK" not in os.environ and env.creates_processes_externally:
            return env.node_rank()
        return self.comm.rank // max(1, self.num_processes)

    @property
    def _world(self) -> tuple[int, int]:
        return (self.devices or 1), (self.num_nodes or 1)

    def _planned_world(self) -> int:
        return self._world[0] * self._world[1]

    # ----- life cycle ---------------------------------------------------------------------------
    def launch(self) -> ForkStart | None:
        """Join the job's group; or start the workers: re-run this script through torch's elastic launcher
        (the parent exits with their status), or, in a notebook or with start_method='fork', return a
        ForkStart with which the Trainer runs the stage in forked workers."""
        devices, nodes = self._world
        env = self.cluster_environment or detect_environment()
        if env.creates_processes_externally or launch.launched_externally():
            env.export_variables()  # RANK, WORLD_SIZE, ... for torch.distributed (unless a launcher set them)
            self._check_launched(devices, nodes)
            env.validate_settings(devices, nodes)
        else:
            if env.local_rank() > 0:  # a worker would start workers of its own, each starting more
                raise LaunchError(
                    f"this process has local rank {env.local_rank()} but {type(env).__name__}."
                    "creates_processes_externally is False, so it would start new workers itself: a worker "
                    "never launches. Start the script once (python train.py) or through torchrun/srun, and make "
                    "a custom ClusterEnvironment return True from creates_processes_externally when it starts them."
                )
            if slurm.in_batch_script():  # the batch script's one process: as a plain `python train.py` here
                slurm.check_batch_script(devices, nodes)
            if nodes > 1:
                raise ConfigError(
                    f"num_nodes={nodes} needs a multi-node launcher: start the script with "
                    "torchrun (--nnodes, --rdzv-endpoint) or srun on every node."
                )
            if devices == 1:
                self._group_of_one()
            elif self.start_method != "popen" or fork.interactive():
                return self._fork_start(devices)
            else:
                launch.relaunch(devices, self.max_restarts)  # the parent exits with the workers' status
        self._join_group()
        return None

    @staticmethod
    def _check_launched(devices: int, nodes: int) -> None:
        """The launcher's processes per node (and, under srun, nodes) must be the Trainer's."""
        if slurm.adopted():
            slurm.check_step(devices, nodes)
            return
        local = int(os.environ.get("LOCAL_WORLD_SIZE", devices))
        if local != devices:
            raise ConfigError(
                f"this job was launched with {local} processes per node but Trainer has devices={devices};"
                f" make them agree (e.g. torchrun --nproc_per_node={devices}, or devices={local})."
            )

    def _group_of_one(self) -> None:
        """A group of one, in this process, on a store of its own: nothing goes into os.environ, where a
        later fit with devices=2 (a notebook) or a subprocess would read it as a launcher's job of one."""
        self._alone = True

    def _fork_start(self, devices: int) -> ForkStart:
        name = self.name if self.start_method == "popen" else f"{self.name}_{self.start_method}"
        if not self.fork_start:
            raise ConfigError(
                f"strategy={name!r} with devices={devices} cannot start its workers from this process (a "
                "notebook, fork or spawn): put the code in a script and run `python train.py`, or use "
                "strategy='ddp' (starts its workers here) or 'dp'."
            )
        if self.start_method in ("spawn", "forkserver"):
            return fork.ForkStart(self, devices, self.start_method)
        fork.check_forkable(name)
        if self.start_method != "fork":
            print(
                f"[tandem] strategy={self.name!r} in an interactive session: forking the {devices} workers "
                "(as strategy='ddp_notebook' does)",
                file=sys.stderr,
            )
        return fork.ForkStart(self, devices)

    def _join_group(self) -> None:
        device = pick_device(self.accelerator or "auto", self.comm.local_rank)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        self._root_device = device
        group_exit.joined()  # closed at exit, whoever makes it (strategies/group_exit.py)
        if dist.is_initialized():  # the user's script, or a launcher, made the group
            self.comm.device = comm_device(None, device)
            return
        backend = self.backend or ("nccl" if device.type == "cuda" else "gloo")
        timeout = datetime.timedelta(seconds=self.timeout_s)
        if backend == "gloo":
            bind_gloo_interface()
        if "nccl" in backend:
            nccl_error_handling()
        _unpin_default_group()
        private = None if self._alone else _attempt_store(timeout)
        if self._alone:
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
        elif private is None:
            dist.init_process_group(backend, timeout=timeout)
        else:
            dist.init_process_group(
                backend,
                store=private[0],
                rank=self.comm.rank,
                world_size=self.comm.world_size,
                timeout=timeout,
            )
        self.comm.device = comm_device(None, device)  # NCCL: this rank's GPU; gloo: the CPU
        if self.peer_timeout_s and is_multinode():  # one node's agent already sees its own dead workers
            prefix = f"{private[1]}/heartbeat" if private else None
            beat = Heartbeat(self.comm.rank, self.comm.world_size, self.peer_timeout_s, prefix=prefix)
            beat.start()
            atexit.register(beat.stop)  # runs before group_exit's (atexit is last-in, first-out)

    def setup(self, task: Any) -> None:
        sync = self.layer_sync or (TorchSyncBatchNorm() if self.sync_batchnorm else None)
        if sync is not None:  # replaces the layers in place (the task object stays)
            converted = (
                sync.apply(task, self.root_device, self.comm.device)
                if isinstance(sync, TorchSyncBatchNorm)
                else sync.apply(task)
            )
            if converted is not task:
                raise ConfigError(
                    f"{type(sync).__name__}.apply must convert the task's layers in place and return the task"
                )
            self._synced = sync
        super().setup(task)

    def teardown(self) -> None:
        if dist.is_initialized():
            self.comm.settle()  # the last stop agreement still in flight
        sync, task = getattr(self, "_synced", None), self.lightning_module
        if sync is not None and task is not None:  # the task's own layers back, as Lightning's teardown does
            sync.revert(task)
            self._synced = None

        if self.replicas is not None:
            self.replicas.shutdown()

    @property
    def process_group_backend(self) -> str | None:
        """The torch.distributed backend asked for (None until chosen: gloo on the CPU, nccl on CUDA)."""
        return self.backend

    @property
    def root_device(self) -> torch.device:
        """The device of this process's local rank."""
        if self._root_device is None:
            device = pick_device(self.accelerator or "auto", self.comm.local_rank)
            if (
                device.type == "mps"
            ):  # torch.distributed has no backend for MPS tensors (Lightning refuses too)
                raise ConfigError(
                    f"{type(self).__name__} runs one process per device, which Apple MPS does not support (no "
                    "torch.distributed backend for MPS tensors); use strategy='auto' on MPS, or accelerator='cpu'."
                )
            self._root_device = device
        return self._root_device

    # ----- data ---------------------------------------------------------------------------------
    def process_dataloader(self, loader: Any, stage: str) -> Any:
        """Give each rank its shard (strategies/sharding.py): a DistributedSampler for training, an unpadded
        shard for evaluation, in any DataLoader class; in a group of one process too, as Lightning."""
        if not self.use_distributed_sampler:
            return loader
        seed = int(os.environ.get("TANDEM_GLOBAL_SEED", 0))
        overfit = bool(self._overfit_batches)
        rank, world = self.comm.rank, self.comm.world_size
        if self.replicas is not None and stage == "train":  # each replica group trains on its own share
            self.replicas.check_loader(loader)
            rank, world = self.replicas.data_shard(rank, world)
        return shard_loader(loader, stage, rank, world, seed, overfit)

    # ----- checkpoints --------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        if self.replicas is not None:
            state["fault_tolerance"] = self.replicas.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if self.replicas is not None and state.get("fault_tolerance"):
            self.replicas.load_state_dict(state["fault_tolerance"])
