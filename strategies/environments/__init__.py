"""Cluster environments (Lightning's ``lightning.pytorch.plugins.environments``): where a job's processes come
from and what rank each is. See strategies/environments/base.py for how a strategy uses one."""

from __future__ import annotations

from typing import Any

from strategies.environments.base import ClusterEnvironment, export
from strategies.environments.detect import detect
from strategies.environments.lsf import LSFEnvironment
from strategies.environments.slurm import SLURMEnvironment, environment_of
from strategies.environments.torch_vars import (
    KubeflowEnvironment,
    LightningEnvironment,
    TorchElasticEnvironment,
)
from tandem_core.errors import ConfigError


def _refused(name: str, why: str) -> type[ClusterEnvironment]:
    def __new__(cls: Any, *args: Any, **kwargs: Any) -> Any:  # (before the ABC's check of abstract methods)
        raise ConfigError(f"{name} is not supported by Tandem: {why}")

    doc = f"Lightning's {name}: refused when built ({why})."
    body = {"__new__": __new__, "__doc__": doc, "__module__": __name__, "detect": staticmethod(lambda: False)}
    return type(name, (ClusterEnvironment,), body)


MPIEnvironment = _refused(
    "MPIEnvironment",
    "processes started by mpirun are not joined through mpi4py; start them with torchrun or srun, or export "
    "RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT from mpirun's variables",
)
XLAEnvironment = _refused("XLAEnvironment", "TPUs/XLA are not supported; run on CUDA or the CPU")

__all__ = [
    "ClusterEnvironment",
    "KubeflowEnvironment",
    "LSFEnvironment",
    "LightningEnvironment",
    "MPIEnvironment",
    "SLURMEnvironment",
    "TorchElasticEnvironment",
    "XLAEnvironment",
    "detect",
    "environment_of",
    "export",
]
