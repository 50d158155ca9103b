"""ClusterEnvironment: where a job's processes come from and what rank each one is (Lightning's plugin base,
``lightning.pytorch.plugins.environments.ClusterEnvironment``).

A parallel strategy keeps one as ``strategy.cluster_environment``: passed in ``Trainer(plugins=[...])`` or in
the strategy's constructor, else the one the variables of this process name (strategies/environments/detect.py).
When the environment `creates_processes_externally` (torchrun, srun, jsrun, a Kubeflow job, or processes you
started with LOCAL_RANK set), the strategy starts no workers: it takes this process's ranks and the main
address from the environment (`export`) and joins the process group. Otherwise Tandem starts the workers itself.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod

from tandem_core.errors import ConfigError


class ClusterEnvironment(ABC):
    """Subclass it for a scheduler Tandem does not know: answer the ranks and the main address. Example::

    class MyCluster(ClusterEnvironment):
        creates_processes_externally = True
        main_address = property(lambda self: os.environ["HEAD_NODE"])
        ...
    """

    @property
    @abstractmethod
    def creates_processes_externally(self) -> bool:
        """Whether the scheduler started every process (True), or Tandem must start them (False)."""

    @property
    @abstractmethod
    def main_address(self) -> str:
        """The address of the process that hosts the rendezvous (rank 0's node)."""

    @property
    @abstractmethod
    def main_port(self) -> int:
        """The port of the rendezvous on `main_address`."""

    @staticmethod
    @abstractmethod
    def detect() -> bool:
        """Whether the variables of this process say it runs under this environment."""

    @abstractmethod
    def world_size(self) -> int:
        """The number of processes in the job."""

    @abstractmethod
    def set_world_size(self, size: int) -> None:
        """Told the job's size by the strategy (environments that read it from the scheduler ignore it)."""

    @abstractmethod
    def global_rank(self) -> int:
        """This process's rank in the job."""

    @abstractmethod
    def set_global_rank(self, rank: int) -> None:
        """Told this process's rank by the strategy (environments that read it ignore it)."""

    @abstractmethod
    def local_rank(self) -> int:
        """This process's rank on its node."""

    @abstractmethod
    def node_rank(self) -> int:
        """This node's index in the job."""

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        """Raise when the Trainer's devices and num_nodes cannot be this job's shape (none are checked here)."""
        return

    def teardown(self) -> None:
        """Undo what the environment set for the job (called when a stage ends; nothing by default)."""
        return

    def export_variables(self) -> None:
        """Before the process group is joined: torch.distributed's variables from this environment (`export`)."""
        export(self)


def export(env: ClusterEnvironment) -> None:
    """Give torch.distributed what `env` says about this process (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
    MASTER_PORT), unless a launcher set RANK already: the process group then joins with ``env://``."""
    if "RANK" in os.environ:
        return
    values = {
        "RANK": env.global_rank(),
        "WORLD_SIZE": env.world_size(),
        "LOCAL_RANK": env.local_rank(),
        "MASTER_ADDR": env.main_address,
        "MASTER_PORT": env.main_port,
    }
    if int(values["WORLD_SIZE"]) > 1 and "MASTER_PORT" not in os.environ and not _port_agreed(env):
        raise ConfigError(
            f"{type(env).__name__}: this process was started outside Tandem (LOCAL_RANK is set) in a job of "
            f"{values['WORLD_SIZE']} processes, but MASTER_PORT is not set, so the processes cannot agree on a "
            "port: export MASTER_ADDR and MASTER_PORT in every process (torchrun sets them for you)"
        )
    os.environ.update({k: str(v) for k, v in values.items()})


def _port_agreed(env: ClusterEnvironment) -> bool:
    """Whether `env` derives its port from something every process shares (not a free port of its own)."""
    return getattr(env, "port_is_shared", True)
