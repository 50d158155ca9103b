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
_MIXED_DTYPES = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}


def _context(name: str, device_type: str) -> Callable[[], Any]:
    """What builds the forward context of precision `name` on a device of `device_type`."""
    if name in _MIXED_DTYPES:
        dtype = _MIXED_DTYPES[name]
        return lambda: torch.autocast(device_type, dtype=dtype)
    if name in ("bf16-true", "16-true", "64-true"):  # Lightning's HalfPrecision/DoublePrecision
        dtype = _TRUE_DTYPES[name]
        return lambda: default_dtype(dtype)
    return contextlib.nullcontext


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Any:
    """torch's default dtype set to `dtype` inside (tensors a step creates get the parameters' dtype)."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def _cast_floats(data: Any, dtype: torch.dtype) -> Any:
    from strategies.batch import apply_to_tensors

    return apply_to_tensors(data, lambda t: t.to(dtype) if t.is_floating_point() else t)


def needs_closure(optimizer: torch.optim.Optimizer) -> bool:
    """True for optimizers such as LBFGS whose step() cannot run without a closure."""
    import inspect

    try:
        param = inspect.signature(optimizer.step).parameters.get("closure")
    except (TypeError, ValueError):
        return False
    return param is not None and param.default is inspect.Parameter.empty


class Precision:
    """Autocast, loss scaling and parameter dtype for one precision setting; Lightning's precision plugin
    (``lightning.pytorch.plugins.Precision``) by its methods too (``forward_context``, ``convert_module``,
    ``convert_input``, ``module_init_context``, ``clip_gradients``, ``optimizer_step``, ...). The classes Lightning
    names for each setting (MixedPrecision, HalfPrecision, DoublePrecision, FSDPPrecision) are in
    strategies/precision_plugins.py; ``plugin_for(name)`` there builds the one a name asks for.

    Example: ``Precision("16-mixed").setup(torch.device("cpu"))`` then use ``autocast()``, ``backward``,
    ``unscale`` and ``step``.
    """

    def __init__(self, precision: str | int = "32-true") -> None:
        name = str(precision)
        if name in REFUSED:
            raise ConfigError(REFUSED[name])
        check_choice("precision", name, PRECISIONS)
        self.name = _ALIASES[name]
        self.device: Any = torch.device("cpu")
        self.scaler: torch.amp.GradScaler | None = None
        self._autocast: Callable[[], Any] = contextlib.nullcontext

    @property
    def precision(self) -> str:
        """The setting's full name ("32-true", "bf16-mixed", ...): Lightning's ``Precision.precision``."""
        return self.name

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
        return f"{type(self).__name__}({self.name!r})"

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
        self.device = device.type if isinstance(self.device, str) else device
        if self.name == "bf16-mixed":
            if device.type == "cuda" and not torch.cuda.is_bf16_supported():
                raise ConfigError(
                    f"precision='bf16-mixed' needs a GPU with bfloat16 support; {torch.cuda.get_device_name(device)}"
                    " has none. Use precision='16-mixed' or '32-true'."
                )
        elif self.name == "16-mixed":
            if device.type not in ("cuda", "cpu", "mps"):
                raise ConfigError(f"precision='16-mixed' is not supported on {device.type}; use '32-true'.")
            if self.scaler is None or getattr(self, "_default_scaler", "") not in ("", device.type):
                self.scaler = torch.amp.GradScaler(device.type)  # (one made for another device replaced)
        elif self.name == "bf16-true" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
            raise ConfigError(
                f"precision='bf16-true' needs a GPU with bfloat16 support; {torch.cuda.get_device_name(device)}"
                " has none. Use precision='16-true' or '32-true'."
            )
        if type(self).forward_context is not Precision.forward_context:  # a subclass's own context
            self._autocast = self.forward_context
        else:
            self._autocast = _context(self.name, device.type)

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
        """The loop's optimizer step: `optimizer_step` (a subclass may override that, Lightning's name)."""
        return self.optimizer_step(optimizer, None, closure, **kwargs)

    # ----- Lightning's plugin methods (strategies/precision_plugins.py says which the loop calls) ---------
    def forward_context(self) -> Any:
        """The context the steps run in (autocast for "-mixed", the dtype as torch's default for "-true")."""
        device = self.device if isinstance(self.device, str) else self.device.type
        return _context(self.name, device)()

    def module_init_context(self) -> Any:
        """The context modules are built in (``configure_model``): "-true" precisions create them in their dtype."""
        dtype = self.param_dtype
        return default_dtype(dtype) if dtype is not None else contextlib.nullcontext()

    def tensor_init_context(self) -> Any:
        """The context tensors are created in (as module_init_context)."""
        return self.module_init_context()

    def convert_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """The module with its floating parameters and buffers in this precision's dtype ("-true" precisions)."""
        if self.name == "64-true":  # floating tensors only (a complex buffer keeps its dtype), as Lightning's
            return module.double()
        dtype = self.param_dtype
        return module.to(dtype=dtype) if dtype is not None else module

    def convert_input(self, data: Any) -> Any:
        """`data` with its floating tensors in this precision's dtype ("-true" precisions), else unchanged."""
        dtype = self.param_dtype
        return data if dtype is None else _cast_floats(data, dtype)

    def convert_output(self, data: Any) -> Any:
        """`data` with its floating tensors back in torch's default dtype ("-true" precisions)."""
        return data if self.param_dtype is None else _cast_floats(data, torch.get_default_dtype())

    def optimizer_step(
        self, optimizer: Any, model: Any = None, closure: Callable[[], Any] | None = None, **kwargs: Any
    ) -> Any:
        """Optimizer step; `closure` (the batch's forward and backward, then the gradients' final touches)
        runs inside it; `kwargs` go to the optimizer's ``step``, as Lightning passes them (`model` is not
        needed: the loop runs the hooks). Under 16-mixed the closure runs first, once, and the scaler skips a
        step whose gradients are inf/nan (optimizers that re-evaluate the closure, such as LBFGS, are refused)."""
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

    def clip_gradients(
        self, optimizer: Any, clip_val: float = 0.0, gradient_clip_algorithm: Any = "norm"
    ) -> None:
        """Clip by value or by total norm (strategies/clipping.py); nothing when `clip_val` is 0."""
        if clip_val <= 0:
            return
        if str(getattr(gradient_clip_algorithm, "value", gradient_clip_algorithm)) == "value":
            self.clip_grad_by_value(optimizer, clip_val)
        else:
            self.clip_grad_by_norm(optimizer, clip_val)

    def clip_grad_by_value(self, optimizer: Any, clip_val: float) -> None:
        """Clamp every gradient of `main_params` to [-clip_val, clip_val]."""
        from strategies.clipping import clip_grad_value

        clip_grad_value([p for p in self.main_params(optimizer) if p.grad is not None], clip_val)

    def clip_grad_by_norm(self, optimizer: Any, clip_val: float) -> None:
        """Scale the gradients of `main_params` so that their total 2-norm is at most `clip_val`."""
        from strategies.clipping import clip_grad_norm

        clip_grad_norm([p for p in self.main_params(optimizer) if p.grad is not None], clip_val)

    def main_params(self, optimizer: Any) -> Any:
        """The parameters the optimizer steps (Lightning's: for clipping)."""
        return (p for group in optimizer.param_groups for p in group["params"])

    def pre_backward(self, tensor: torch.Tensor, module: Any = None) -> torch.Tensor:
        """The loss to run backward on (scaled under 16-mixed); the loop fires the backward hooks itself."""
        return self.scale(tensor)

    def backward(
        self, tensor: torch.Tensor, model: Any = None, optimizer: Any = None, *args: Any, **kwargs: Any
    ) -> None:
        """Backward of `tensor`: through ``model.backward`` when a model is given, else ``tensor.backward``."""
        if model is not None:
            model.backward(tensor, *args, **kwargs)
        else:
            tensor.backward(*args, **kwargs)

    def post_backward(self, tensor: torch.Tensor, module: Any = None) -> torch.Tensor:
        """After the backward: the loss as it was."""
        return tensor

    def train_step_context(self) -> Any:
        """The context of training_step: `forward_context`."""
        return self.forward_context()

    def val_step_context(self) -> Any:
        """The context of validation_step: `forward_context`."""
        return self.forward_context()

    def test_step_context(self) -> Any:
        """The context of test_step: `forward_context`."""
        return self.forward_context()

    def predict_step_context(self) -> Any:
        """The context of predict_step: `forward_context`."""
        return self.forward_context()

    def connect(self, model: Any, optimizers: Any, lr_schedulers: Any) -> tuple[Any, Any, Any]:
        """Lightning's hook to wrap model and optimizers: returns them unchanged."""
        return model, optimizers, lr_schedulers

    def unscale_gradients(self, optimizer: Any) -> None:
        """Lightning's name for `unscale`."""
        self.unscale(optimizer)

    def teardown(self) -> None:
        """Called when a stage ends (nothing to release by default)."""

    def state_dict(self) -> dict[str, Any]:
        """The precision's state for a checkpoint (the fp16 GradScaler's)."""
        return {"scaler": self.scaler.state_dict()} if self.scaler is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what state_dict returned."""
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
