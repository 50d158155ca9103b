"""Which cluster environment this process runs under, from its variables (Lightning's order: torchrun first,
since it also runs inside SLURM jobs; then SLURM, then LSF; else the default LightningEnvironment)."""

from __future__ import annotations

from strategies.environments.base import ClusterEnvironment
from strategies.environments.lsf import LSFEnvironment
from strategies.environments.slurm import SLURMEnvironment
from strategies.environments.torch_vars import LightningEnvironment, TorchElasticEnvironment

#: the environments tried in turn (KubeflowEnvironment is never detected: pass it in plugins)
DETECTED = (TorchElasticEnvironment, SLURMEnvironment, LSFEnvironment)


def detect() -> ClusterEnvironment:
    """A new instance of the first environment of DETECTED whose variables are set, else LightningEnvironment."""
    for cls in DETECTED:
        if cls.detect():
            return cls()
    return LightningEnvironment()
