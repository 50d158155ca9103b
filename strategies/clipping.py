"""Gradient clipping of an optimizer's parameters, by total norm or by value (Trainer's gradient_clip_val)."""

from __future__ import annotations

import torch

from tandem_core.errors import ConfigError


def clip_gradients(optimizer: torch.optim.Optimizer, clip_val: float, algorithm: str | None = "norm") -> None:
    """Clip the gradients of the optimizer's parameters by total norm (also for None) or by value."""
    algorithm = algorithm or "norm"
    params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    if algorithm == "norm":
        torch.nn.utils.clip_grad_norm_(params, clip_val)
    elif algorithm == "value":
        torch.nn.utils.clip_grad_value_(params, clip_val)
    else:
        raise ConfigError(f"gradient_clip_algorithm must be 'norm' or 'value', got {algorithm!r}")
