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

__all__ = [
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
