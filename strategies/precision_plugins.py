"""Lightning's precision plugin classes by their names (``lightning.pytorch.plugins.precision``), on Tandem's
Precision (strategies/precision.py): each is the Precision of its settings, with Lightning's constructor.

    Trainer(plugins=[MixedPrecision("bf16-mixed", "cpu")])      # the same run as Trainer(precision="bf16-mixed")
    Trainer(plugins=[HalfPrecision("bf16-true")])               # ... as precision="bf16-true"

A Trainer builds the class Lightning builds for a precision name: ``Precision`` ("32-true"), ``DoublePrecision``
("64-true"), ``HalfPrecision`` ("16-true", "bf16-true"), ``MixedPrecision`` ("16-mixed", "bf16-mixed"), and
``FSDPPrecision`` under strategy="fsdp". A subclass may override the methods Tandem's loop calls
(``forward_context``, ``convert_module``, ``convert_input``, ``module_init_context``, ``optimizer_step``,
``clip_gradients`` and the clipping methods, ``state_dict``/``load_state_dict``, ``teardown``); overriding one
the loop does not call (the backward hooks, the per-stage step contexts, ``connect``) is refused when the
Trainer is built (`check_overrides`). The plugins that need libraries Tandem does not use (bitsandbytes,
DeepSpeed, Transformer Engine, XLA) are refused by name when built.
"""

from __future__ import annotations

from typing import Any

import torch

from strategies.precision import _ALIASES, Precision
from tandem_core.errors import ConfigError, TaskError

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
    "check_overrides",
    "plugin_for",
]


def _full_name(cls: str, precision: Any, allowed: tuple[str, ...]) -> str:
    """`precision` as one of `allowed` full names, or a ConfigError (Lightning's classes take no short aliases)."""
    if isinstance(precision, str) and precision in allowed:
        return precision
    listed = " or ".join(repr(a) for a in allowed)
    raise ConfigError(f"{cls}(precision={precision!r}): the precision must be {listed} (the full name)")


def _check_scaler(cls: str, name: str, scaler: Any) -> None:
    if scaler is not None and name != "16-mixed":
        raise ConfigError(
            f"{cls}(precision={name!r}, scaler=...): `precision={name!r}` does not use a scaler, found "
            f"{scaler!r}; drop scaler= (only '16-mixed' scales the loss)"
        )


class MixedPrecision(Precision):
    """Automatic mixed precision: the steps under ``torch.autocast`` in float16 (with a gradient scaler) or
    bfloat16. `device` is the device type autocast is for ("cuda", "cpu", "mps"); under a Trainer the run's own
    device is used. Example: ``Trainer(plugins=[MixedPrecision("16-mixed", "cuda")])``."""

    def __init__(self, precision: str, device: str, scaler: torch.amp.GradScaler | None = None) -> None:
        name = _full_name("MixedPrecision", precision, ("16-mixed", "bf16-mixed"))
        _check_scaler("MixedPrecision", name, scaler)
        super().__init__(name)
        self.device = str(device)
        if scaler is None and name == "16-mixed" and _usable(self.device):
            self._default_scaler = torch.device(self.device).type  # replaced in setup on another device
            scaler = torch.amp.GradScaler(self._default_scaler)
        self.scaler = scaler

    def autocast_context_manager(self) -> torch.autocast:
        """The ``torch.autocast`` the steps run in."""
        dtype = torch.float16 if self.name == "16-mixed" else torch.bfloat16
        return torch.autocast(torch.device(self.device).type, dtype=dtype)

    def forward_context(self) -> Any:
        return self.autocast_context_manager()

    def clip_gradients(
        self, optimizer: Any, clip_val: float = 0.0, gradient_clip_algorithm: Any = "norm"
    ) -> None:
        """As Precision's; refused for an optimizer that unscales inside its own step (a fused one)."""
        if clip_val > 0 and getattr(optimizer, "_step_supports_amp_scaling", False):
            raise TaskError(
                f"gradient clipping under precision={self.name!r} cannot be done with "
                f"{type(optimizer).__qualname__}: it unscales the gradients inside its own step (a fused "
                "optimizer?), after clipping would have to run; use a non-fused optimizer or no clipping"
            )
        super().clip_gradients(optimizer, clip_val, gradient_clip_algorithm)


def _usable(device: str) -> bool:
    kind = torch.device(device).type
    return kind != "cuda" or torch.cuda.is_available()


class HalfPrecision(Precision):
    """Parameters and steps in float16 ("16-true") or bfloat16 ("bf16-true"), the dtype as torch's default
    inside the steps and ``configure_model``. Example: ``Trainer(plugins=[HalfPrecision("bf16-true")])``."""

    def __init__(self, precision: str = "16-true") -> None:
        super().__init__(_full_name("HalfPrecision", precision, ("16-true", "bf16-true")))

    @property
    def _desired_input_dtype(self) -> torch.dtype:
        return self.param_dtype  # type: ignore[return-value]


class DoublePrecision(Precision):
    """Parameters, inputs and steps in float64 ("64-true"). Example: ``Trainer(plugins=[DoublePrecision()])``."""

    def __init__(self) -> None:
        super().__init__("64-true")


class FSDPPrecision(Precision):
    """The precision of strategy="fsdp" (torch's ``fully_shard``), Lightning's class for it: "-true" settings
    hold the shards in that dtype; "bf16-mixed" computes in bfloat16 and reduces gradients in float32
    (`mixed_precision_config`, the policy Tandem's FSDP applies). "16-mixed" is refused by FSDPStrategy at
    set-up (no scaler sees the sharded gradients)."""

    def __init__(self, precision: str, scaler: Any = None) -> None:
        allowed = ("32-true", "16-true", "bf16-true", "16-mixed", "bf16-mixed")
        name = _full_name("FSDPPrecision", precision, allowed)
        _check_scaler("FSDPPrecision", name, scaler)
        super().__init__(name)
        self.scaler = scaler

    @property
    def mixed_precision_config(self) -> Any:
        """torch's ``MixedPrecisionPolicy`` that strategies/fsdp.py gives ``fully_shard`` for this setting."""
        from torch.distributed.fsdp import MixedPrecisionPolicy

        dtype = fsdp_param_dtype(self.name)
        return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32 if dtype else None)


def fsdp_param_dtype(name: str) -> torch.dtype | None:
    """The dtype fully_shard computes in for precision `name` (None: the parameters' own)."""
    return torch.bfloat16 if name == "bf16-mixed" else None


def _refused(cls_name: str, needs: str, instead: str) -> type[Precision]:
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        raise ConfigError(f"{cls_name} needs {needs}, which Tandem does not use; {instead}")

    doc = f"Lightning's {cls_name}: refused when built ({needs} is not part of Tandem); {instead}."
    return type(cls_name, (Precision,), {"__init__": __init__, "__doc__": doc, "__module__": __name__})


BitsandbytesPrecision = _refused(
    "BitsandbytesPrecision",
    "bitsandbytes (CUDA-only quantized layers)",
    "train in precision='bf16-true' or 'bf16-mixed', or quantize the model with bitsandbytes yourself",
)
DeepSpeedPrecision = _refused(
    "DeepSpeedPrecision", "DeepSpeed", "use strategy='fsdp' with precision='bf16-mixed' (or '32-true')"
)
TransformerEnginePrecision = _refused(
    "TransformerEnginePrecision",
    "NVIDIA Transformer Engine (fp8 on Hopper GPUs)",
    "use precision='bf16-mixed' or 'bf16-true'",
)
XLAPrecision = _refused("XLAPrecision", "torch_xla (TPUs)", "run on CUDA or the CPU with a precision name")

_CLASSES: dict[str, Any] = {
    "32-true": lambda: Precision(),
    "64-true": DoublePrecision,
    "16-true": lambda: HalfPrecision("16-true"),
    "bf16-true": lambda: HalfPrecision("bf16-true"),
    "16-mixed": lambda: MixedPrecision("16-mixed", "cpu"),
    "bf16-mixed": lambda: MixedPrecision("bf16-mixed", "cpu"),
}


def plugin_for(precision: str | int, fsdp: bool = False) -> Precision:
    """Lightning's plugin for a precision name (or alias): the class its connector builds for it."""
    name = str(precision)
    full = _ALIASES.get(name)
    if full is None:
        return Precision(name)  # the refusal, or the unknown name listed against the valid ones
    if fsdp and full != "64-true":  # (Tandem's fsdp also trains in float64: DoublePrecision, as elsewhere)
        return FSDPPrecision(full)
    plugin = _CLASSES[full]()
    if isinstance(plugin, MixedPrecision):  # the device comes from the run (setup)
        plugin.scaler, plugin._default_scaler = None, ""
    return plugin


#: Lightning's Precision methods that Tandem's loop does not call, with what to override instead
NOT_CALLED = {
    "pre_backward": "Task.on_before_backward (or a callback's)",
    "backward": "Task.backward",
    "post_backward": "Task.on_after_backward (or a callback's)",
    "train_step_context": "forward_context (used for every step)",
    "val_step_context": "forward_context (used for every step)",
    "test_step_context": "forward_context (used for every step)",
    "predict_step_context": "forward_context (used for every step)",
    "connect": "Task.configure_optimizers / Strategy.setup",
}


def check_overrides(plugin: Precision) -> None:
    """A ConfigError when `plugin`'s class overrides a method the loop would never call."""
    cls = type(plugin)
    for name, instead in NOT_CALLED.items():
        if getattr(cls, name) is not getattr(Precision, name):
            raise ConfigError(
                f"{cls.__name__}.{name} overrides Lightning's Precision.{name}, which Tandem's loop does not "
                f"call (it runs that part itself); override {instead} instead"
            )
