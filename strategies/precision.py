"""Numerical precision: full 32/64-bit, bf16/fp16 autocast (fp16 with a gradient scaler), and the "-true" half
precisions that hold parameters in bf16/fp16 (Lightning's HalfPrecision)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

from tandem_core.errors import ConfigError, check_choice

# Lightning's names and their short aliases.
_ALIASES = {
    "32": "32-true",
    "32-true": "32-true",
    "64": "64-true",
    "64-true": "64-true",
    "bf16": "bf16-mixed",
    "bf16-mixed": "bf16-mixed",
    "16": "16-mixed",
    "16-mixed": "16-mixed",
    "bf16-true": "bf16-true",
    "16-true": "16-true",
}
PRECISIONS = (
    "32-true",
    "64-true",
    "bf16-mixed",
    "16-mixed",
    "bf16-true",
    "16-true",
    "32",
    "64",
    "bf16",
    "16",
)
#: Lightning's precision names Tandem refuses, with what to use instead
REFUSED = {
    name: f"precision={name!r} (NVIDIA Transformer Engine's fp8) is not supported by Tandem; use 'bf16-mixed' "
    "or 'bf16-true'"
    for name in ("transformer-engine", "transformer-engine-float16")
}
_TRUE_DTYPES = {"64-true": torch.float64, "bf16-true": torch.bfloat16, "16-true": torch.float16}
_COMPUTE_DTYPES = {
    "32-true": torch.float32,
    "bf16-mixed": torch.bfloat16,
    "16-mixed": torch.float16,
    **_TRUE_DTYPES,
}


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Any:
    """torch's default dtype set to `dtype` inside (tensors a step creates get the parameters' dtype)."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def needs_closure(optimizer: torch.optim.Optimizer) -> bool:
    """True for optimizers such as LBFGS whose step() cannot run without a closure."""
    import inspect

    try:
        param = inspect.signature(optimizer.step).parameters.get("closure")
    except (TypeError, ValueError):
        return False
    return param is not None and param.default is inspect.Parameter.empty


class Precision:
    """Autocast, loss scaling and parameter dtype for one precision setting.

    Example: ``Precision("16-mixed").setup(torch.device("cpu"))`` then use ``autocast()``, ``backward``,
    ``unscale`` and ``step``.
    """

    def __init__(self, precision: str | int = "32-true") -> None:
        name = str(precision)
        if name in REFUSED:
            raise ConfigError(REFUSED[name])
        check_choice("precision", name, PRECISIONS)
        self.name = _ALIASES[name]
        self.device = torch.device("cpu")
        self.scaler: torch.amp.GradScaler | None = None
        self._autocast: Callable[[], Any] = contextlib.nullcontext

    @classmethod
    def of(cls, precision: Precision | str | int) -> Precision:
        """The given Precision, or a new one for a name ("bf16-mixed", 16, ...)."""
        return precision if isinstance(precision, Precision) else cls(precision)

    def __eq__(self, other: object) -> bool:
        """Equal to another Precision or a name of the same setting: ``trainer.precision == "16-mixed"``."""
        if isinstance(other, Precision):
            return self.name == other.name
        if isinstance(other, (str, int)):
            return self.name == _ALIASES.get(str(other))
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.name)

    def __repr__(self) -> str:
        return f"Precision({self.name!r})"

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype the matmuls compute in: autocast's under "-mixed", the parameters' under "-true" (what a
        GPU's peak FLOP/s is looked up for: ThroughputMonitor's MFU)."""
        return _COMPUTE_DTYPES[self.name]

    @property
    def param_dtype(self) -> torch.dtype | None:
        """The dtype parameters and float inputs are converted to, or None to leave them."""
        return _TRUE_DTYPES.get(self.name)

    def setup(self, device: torch.device) -> None:
        """Check the device can run this precision and build the autocast context and scaler."""
        self.device = device
        if self.name == "bf16-mixed":
            if device.type == "cuda" and not torch.cuda.is_bf16_supported():
                raise ConfigError(
                    f"precision='bf16-mixed' needs a GPU with bfloat16 support; {torch.cuda.get_device_name(device)}"
                    " has none. Use precision='16-mixed' or '32-true'."
                )
            self._autocast = lambda: torch.autocast(device.type, dtype=torch.bfloat16)
        elif self.name == "16-mixed":
            if device.type not in ("cuda", "cpu", "mps"):
                raise ConfigError(f"precision='16-mixed' is not supported on {device.type}; use '32-true'.")
            self._autocast = lambda: torch.autocast(device.type, dtype=torch.float16)
            if self.scaler is None:
                self.scaler = torch.amp.GradScaler(device.type)
        elif self.name in ("bf16-true", "16-true"):  # Lightning's HalfPrecision: steps run with this default
            if self.name == "bf16-true" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
                raise ConfigError(
                    f"precision='bf16-true' needs a GPU with bfloat16 support; {torch.cuda.get_device_name(device)}"
                    " has none. Use precision='16-true' or '32-true'."
                )
            dtype = _TRUE_DTYPES[self.name]
            self._autocast = lambda: default_dtype(dtype)

    def autocast(self) -> Any:
        """Context manager for the forward pass."""
        return self._autocast()

    @property
    def casts(self) -> bool:
        """Whether `autocast()` does anything (after setup): full precision's is a no-op context."""
        return self._autocast is not contextlib.nullcontext

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss to call backward on: scaled under 16-mixed, else unchanged."""
        return self.scaler.scale(loss) if self.scaler is not None else loss

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        """Bring gradients back to their true scale so hooks and clipping see real values."""
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def step(
        self, optimizer: torch.optim.Optimizer, closure: Callable[[], Any] | None = None, **kwargs: Any
    ) -> Any:
        """Optimizer step; `closure` (the batch's forward and backward, then the gradients' final touches)
        runs inside it; `kwargs` go to the optimizer's ``step``, as Lightning passes them. Under 16-mixed the closure runs first, once, and the scaler skips a step whose
        gradients are inf/nan (optimizers that need to re-evaluate the closure, such as LBFGS, are refused)."""
        if self.scaler is None:
            return (
                optimizer.step(closure=closure, **kwargs) if closure is not None else optimizer.step(**kwargs)
            )
        if needs_closure(optimizer):
            raise ConfigError(
                f"precision='16-mixed' cannot run {type(optimizer).__name__}, which re-evaluates the closure; "
                "use precision='32-true' or 'bf16-mixed'."
            )
        result = closure() if closure is not None else None
        if not any(p.grad is not None for g in optimizer.param_groups for p in g["params"]):
            return result  # nothing to step (the batch was skipped): the scaler has no inf check to use
        self.scaler.step(optimizer, **kwargs)
        self.scaler.update()
        return result

    def state_dict(self) -> dict[str, Any]:
        """The precision's state for a checkpoint (the fp16 GradScaler's)."""
        return {"scaler": self.scaler.state_dict()} if self.scaler is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what state_dict returned."""
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
