"""Lightning's plugins (``lightning.pytorch.plugins``) that ``Trainer(plugins=[...])`` takes, by their names: the
precision plugins, layer sync, the checkpoint IO plugins (``trainer.plugins.io``) and the cluster environments (``trainer.plugins.environments``). Each lives
with the strategies that use it (strategies/precision_plugins.py, strategies/layer_sync.py,
strategies/environments/); strategies/plugins.py hands them to the strategy.

    from trainer.plugins import MixedPrecision, TorchSyncBatchNorm
    from trainer.plugins.environments import SLURMEnvironment
    Trainer(strategy="ddp", devices=2, plugins=[MixedPrecision("bf16-mixed", "cpu"), SLURMEnvironment()])
"""

from __future__ import annotations

from trainer.plugins.deprecated import (  # Lightning's deprecated old names
    BitsandbytesPrecisionPlugin,
    DeepSpeedPrecisionPlugin,
    DoublePrecisionPlugin,
    FSDPMixedPrecisionPlugin,
    FSDPPrecisionPlugin,
    HalfPrecisionPlugin,
    LightningDoublePrecisionModule,
    MixedPrecisionPlugin,
    PrecisionPlugin,
    TransformerEnginePrecisionPlugin,
    XLAPrecisionPlugin,
)
from trainer.plugins.environments import (
    ClusterEnvironment,
    KubeflowEnvironment,
    LightningEnvironment,
    LSFEnvironment,
    MPIEnvironment,
    SLURMEnvironment,
    TorchElasticEnvironment,
    XLAEnvironment,
)
from trainer.plugins.io import AsyncCheckpointIO, CheckpointIO, TorchCheckpointIO
from trainer.plugins.layer_sync import LayerSync, TorchSyncBatchNorm
from trainer.plugins.precision import (
    BitsandbytesPrecision,
    DeepSpeedPrecision,
    DoublePrecision,
    FSDPPrecision,
    HalfPrecision,
    MixedPrecision,
    Precision,
    TransformerEnginePrecision,
    XLAPrecision,
)

__all__ = [
    "BitsandbytesPrecisionPlugin",
    "DeepSpeedPrecisionPlugin",
    "DoublePrecisionPlugin",
    "FSDPMixedPrecisionPlugin",
    "FSDPPrecisionPlugin",
    "HalfPrecisionPlugin",
    "LightningDoublePrecisionModule",
    "MixedPrecisionPlugin",
    "PrecisionPlugin",
    "TransformerEnginePrecisionPlugin",
    "XLAPrecisionPlugin",
    "AsyncCheckpointIO",
    "CheckpointIO",
    "TorchCheckpointIO",
    "BitsandbytesPrecision",
    "ClusterEnvironment",
    "DeepSpeedPrecision",
    "DoublePrecision",
    "FSDPPrecision",
    "HalfPrecision",
    "KubeflowEnvironment",
    "LSFEnvironment",
    "LayerSync",
    "LightningEnvironment",
    "MPIEnvironment",
    "MixedPrecision",
    "Precision",
    "SLURMEnvironment",
    "TorchElasticEnvironment",
    "TorchSyncBatchNorm",
    "TransformerEnginePrecision",
    "XLAEnvironment",
    "XLAPrecision",
]
