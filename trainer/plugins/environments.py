"""Lightning's ``lightning.pytorch.plugins.environments`` under Tandem: the cluster environments, which live in
strategies/environments/ (the strategies use them to start or join a job)."""

from __future__ import annotations

from strategies.environments import (
    ClusterEnvironment,
    KubeflowEnvironment,
    LightningEnvironment,
    LSFEnvironment,
    MPIEnvironment,
    SLURMEnvironment,
    TorchElasticEnvironment,
    XLAEnvironment,
    environment_of,
)

__all__ = [
    "ClusterEnvironment",
    "KubeflowEnvironment",
    "LSFEnvironment",
    "LightningEnvironment",
    "MPIEnvironment",
    "SLURMEnvironment",
    "TorchElasticEnvironment",
    "XLAEnvironment",
    "environment_of",
]
