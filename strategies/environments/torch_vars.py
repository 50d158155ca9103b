"""The environments whose processes carry torch.distributed's own variables (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT): Tandem's default (LightningEnvironment), torchrun (TorchElasticEnvironment) and
Kubeflow's PyTorchJob (KubeflowEnvironment). Lightning's classes of the same names and semantics."""

from __future__ import annotations

import logging
import os
import socket
import warnings

import torch.distributed

from strategies.environments.base import ClusterEnvironment
from tandem_core.errors import ConfigError

log = logging.getLogger(__name__)


def _int_var(name: str, env: str) -> int:
    value = os.environ.get(name)
    if value is None:
        raise ConfigError(
            f"{env}: the variable {name} is not set in this process; start it with its launcher"
        )
    return int(value)


class LightningEnvironment(ClusterEnvironment):
    """No scheduler: a plain ``python train.py`` (Tandem starts the workers, each told its rank), or processes
    you started yourself with at least LOCAL_RANK set (and NODE_RANK on other nodes, MASTER_ADDR/MASTER_PORT).
    The strategy tells it the job's size and this process's rank (`set_world_size`, `set_global_rank`)."""

    port_is_shared = False  # (unless MASTER_PORT is set) a free port of this process: see base.export

    def __init__(self) -> None:
        self._main_port = -1
        self._global_rank = 0
        self._world_size = 1

    @property
    def creates_processes_externally(self) -> bool:
        """True when LOCAL_RANK is set: someone else started this process as one of the job's."""
        return "LOCAL_RANK" in os.environ

    @property
    def main_address(self) -> str:
        return os.environ.get("MASTER_ADDR", "127.0.0.1")

    @property
    def main_port(self) -> int:
        """MASTER_PORT, else a free port of this machine (picked once)."""
        if self._main_port == -1:
            self._main_port = int(os.environ["MASTER_PORT"]) if "MASTER_PORT" in os.environ else free_port()
        return self._main_port

    @staticmethod
    def detect() -> bool:
        return True

    def world_size(self) -> int:
        return self._world_size

    def set_world_size(self, size: int) -> None:
        self._world_size = size

    def global_rank(self) -> int:
        return self._global_rank

    def set_global_rank(self, rank: int) -> None:
        self._global_rank = rank

    def local_rank(self) -> int:
        return int(os.environ.get("LOCAL_RANK", 0))

    def node_rank(self) -> int:
        """NODE_RANK, else torchrun's GROUP_RANK, else 0."""
        return int(os.environ.get("NODE_RANK", os.environ.get("GROUP_RANK", 0)))

    def teardown(self) -> None:
        os.environ.pop("WORLD_SIZE", None)


def free_port() -> int:
    """A port nothing listens on now (STANDALONE_PORT when set, as Lightning's)."""
    if "STANDALONE_PORT" in os.environ:
        return int(os.environ["STANDALONE_PORT"])
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


class TorchElasticEnvironment(ClusterEnvironment):
    """Processes started by torchrun (torch's elastic agent), and Tandem's own workers, which the same agent
    starts: every rank variable comes from it."""

    @property
    def creates_processes_externally(self) -> bool:
        return True

    @property
    def main_address(self) -> str:
        if "MASTER_ADDR" not in os.environ:
            warnings.warn("MASTER_ADDR is not set; using 127.0.0.1", stacklevel=2)
            os.environ["MASTER_ADDR"] = "127.0.0.1"
        return os.environ["MASTER_ADDR"]

    @property
    def main_port(self) -> int:
        if "MASTER_PORT" not in os.environ:
            warnings.warn("MASTER_PORT is not set; using 12910", stacklevel=2)
            os.environ["MASTER_PORT"] = "12910"
        return int(os.environ["MASTER_PORT"])

    @staticmethod
    def detect() -> bool:
        """True in a process torch's elastic agent started (TORCHELASTIC_RUN_ID is set)."""
        return torch.distributed.is_available() and torch.distributed.is_torchelastic_launched()

    def world_size(self) -> int:
        return _int_var("WORLD_SIZE", "TorchElasticEnvironment")

    def set_world_size(self, size: int) -> None:
        log.debug("TorchElasticEnvironment takes the world size from torchrun; %s ignored", size)

    def global_rank(self) -> int:
        return _int_var("RANK", "TorchElasticEnvironment")

    def set_global_rank(self, rank: int) -> None:
        log.debug("TorchElasticEnvironment takes the rank from torchrun; %s ignored", rank)

    def local_rank(self) -> int:
        return _int_var("LOCAL_RANK", "TorchElasticEnvironment")

    def node_rank(self) -> int:
        return int(os.environ.get("GROUP_RANK", 0))

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        """devices x num_nodes must be torchrun's world size."""
        world = self.world_size()
        if num_devices * num_nodes != world:
            raise ConfigError(
                f"devices={num_devices} x num_nodes={num_nodes} = {num_devices * num_nodes} processes, but torchrun "
                f"started {world} (WORLD_SIZE); make them agree (torchrun --nnodes={num_nodes} "
                f"--nproc-per-node={num_devices})"
            )


class KubeflowEnvironment(ClusterEnvironment):
    """A Kubeflow PyTorchJob: one process per pod, its RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set by the
    operator. Never detected by itself: pass ``plugins=[KubeflowEnvironment()]``."""

    @property
    def creates_processes_externally(self) -> bool:
        return True

    @property
    def main_address(self) -> str:
        return os.environ.get("MASTER_ADDR") or _missing("MASTER_ADDR")

    @property
    def main_port(self) -> int:
        return int(os.environ.get("MASTER_PORT") or _missing("MASTER_PORT"))

    @staticmethod
    def detect() -> bool:
        raise NotImplementedError("KubeflowEnvironment is not detected: pass plugins=[KubeflowEnvironment()]")

    def world_size(self) -> int:
        return _int_var("WORLD_SIZE", "KubeflowEnvironment")

    def set_world_size(self, size: int) -> None:
        log.debug("KubeflowEnvironment takes the world size from the PyTorchJob; %s ignored", size)

    def global_rank(self) -> int:
        return _int_var("RANK", "KubeflowEnvironment")

    def set_global_rank(self, rank: int) -> None:
        log.debug("KubeflowEnvironment takes the rank from the PyTorchJob; %s ignored", rank)

    def local_rank(self) -> int:
        return 0  # one process per pod

    def node_rank(self) -> int:
        return self.global_rank()


def _missing(var: str) -> str:
    raise ConfigError(f"KubeflowEnvironment: {var} is not set; the PyTorchJob operator sets it in every pod")
