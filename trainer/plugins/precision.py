"""Lightning's ``lightning.pytorch.plugins.precision`` under Tandem: the precision plugin classes, which live in
strategies/precision.py and strategies/precision_plugins.py."""

from __future__ import annotations

from strategies.precision_plugins import (
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
    "BitsandbytesPrecision",
    "DeepSpeedPrecision",
    "DoublePrecision",
    "FSDPPrecision",
    "HalfPrecision",
    "MixedPrecision",
    "Precision",
    "TransformerEnginePrecision",
    "XLAPrecision",
]
