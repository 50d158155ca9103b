"""Lightning's older names of the precision plugins (``PrecisionPlugin``, ``MixedPrecisionPlugin``, ...), deprecated
in Lightning and kept there as aliases: here each is its new class under the old name, warning a deprecation that
names the class to use. The old names of plugins of libraries Tandem does not use warn, then refuse as the new
names do. ``LightningDoublePrecisionModule`` (a wrapper that fed a task float64 inputs) likewise warns: convert
the inputs with ``trainer.precision_plugin.convert_input`` (``Trainer(precision="64-true")`` does so)."""

from __future__ import annotations

from typing import Any

import torch

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
from tandem_core.rank_zero import rank_zero_deprecation


def _old_name(old: str, new: type) -> type:
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        rank_zero_deprecation(
            f"`{old}` is the old name of `{new.__name__}` (deprecated in Lightning): use "
            f"trainer.plugins.{new.__name__}, which takes the same arguments.",
            stacklevel=4,
        )
        new.__init__(self, *args, **kwargs)

    doc = f"Deprecated: Lightning's old name of `{new.__name__}`."
    return type(old, (new,), {"__init__": __init__, "__doc__": doc, "__module__": __name__})


PrecisionPlugin = _old_name("PrecisionPlugin", Precision)
MixedPrecisionPlugin = _old_name("MixedPrecisionPlugin", MixedPrecision)
HalfPrecisionPlugin = _old_name("HalfPrecisionPlugin", HalfPrecision)
DoublePrecisionPlugin = _old_name("DoublePrecisionPlugin", DoublePrecision)
FSDPPrecisionPlugin = _old_name("FSDPPrecisionPlugin", FSDPPrecision)
BitsandbytesPrecisionPlugin = _old_name("BitsandbytesPrecisionPlugin", BitsandbytesPrecision)
DeepSpeedPrecisionPlugin = _old_name("DeepSpeedPrecisionPlugin", DeepSpeedPrecision)
TransformerEnginePrecisionPlugin = _old_name("TransformerEnginePrecisionPlugin", TransformerEnginePrecision)
XLAPrecisionPlugin = _old_name("XLAPrecisionPlugin", XLAPrecision)


class FSDPMixedPrecisionPlugin(FSDPPrecision):
    """Deprecated: Lightning's old mixed-precision FSDP plugin, `FSDPPrecision` (its `device` is unused)."""

    def __init__(self, precision: str, device: str, scaler: Any = None) -> None:
        rank_zero_deprecation(
            "`FSDPMixedPrecisionPlugin` is deprecated in Lightning: use trainer.plugins.FSDPPrecision(precision, "
            "scaler) (it takes no device).",
            stacklevel=4,
        )
        super().__init__(precision, scaler)


class LightningDoublePrecisionModule(torch.nn.Module):
    """Deprecated: a task wrapper whose forward and steps convert floating-point inputs to float64 (what
    ``Trainer(precision="64-true")`` does itself, through ``precision_plugin.convert_input``)."""

    def __init__(self, pl_module: torch.nn.Module) -> None:
        super().__init__()
        rank_zero_deprecation(
            f"`{type(self).__name__}` is deprecated and not needed: Trainer(precision='64-true') converts the "
            "inputs (trainer.precision_plugin.convert_input(...) does it by hand).",
            stacklevel=4,
        )
        self.module = pl_module

    def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        convert = DoublePrecision().convert_input
        return getattr(self.module, name)(*convert(args), **convert(kwargs))

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._call("forward", *args, **kwargs)

    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        """The wrapped module's training_step, its floating-point inputs in float64."""
        return self._call("training_step", *args, **kwargs)

    def validation_step(self, *args: Any, **kwargs: Any) -> Any:
        """The wrapped module's validation_step, its floating-point inputs in float64."""
        return self._call("validation_step", *args, **kwargs)

    def test_step(self, *args: Any, **kwargs: Any) -> Any:
        """The wrapped module's test_step, its floating-point inputs in float64."""
        return self._call("test_step", *args, **kwargs)

    def predict_step(self, *args: Any, **kwargs: Any) -> Any:
        """The wrapped module's predict_step, its floating-point inputs in float64."""
        return self._call("predict_step", *args, **kwargs)


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
]
