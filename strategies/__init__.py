"""Strategies: single device, threaded DataParallel, and our bucketed-overlap DDP."""

from __future__ import annotations

import importlib
from typing import Any

import torch

from strategies.base import Strategy
from strategies.precision import Precision
from strategies.single import SingleDeviceStrategy
from trainer.errors import ConfigError, choose

# name -> "module:Class"; imported on demand so that `import trainer` stays fast.
STRATEGIES: dict[str, str] = {
    "single": "strategies.single:SingleDeviceStrategy",
    "dp": "strategies.data_parallel:DataParallelStrategy",
    "ddp": "strategies.ddp:DDPStrategy",
    "ddp_accumulate": "strategies.ddp:DDPStrategy",  # config alias: use with accumulate_grad_batches=k
}


def register(name: str, target: str) -> None:
    """Make a strategy available by name in Trainer(strategy=...) and in config files."""
    STRATEGIES[name] = target


def _load(name: str) -> type[Strategy]:
    module, _, cls = STRATEGIES[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def resolve_strategy(
    strategy: Any, accelerator: str, devices: Any, precision: Any, **kwargs: Any
) -> Strategy:
    """Turn Trainer(strategy=..., devices=...) into a Strategy instance."""
    if isinstance(strategy, Strategy):
        strategy.precision = Precision(precision)
        # Trainer(devices=..., accelerator=..., num_nodes=...) wins over the instance's defaults
        if devices != "auto" and hasattr(strategy, "devices"):
            strategy.devices = devices
        if accelerator != "auto":
            strategy.accelerator = accelerator
        if kwargs.get("num_nodes", 1) != 1 and hasattr(strategy, "num_nodes"):
            strategy.num_nodes = kwargs["num_nodes"]
        return strategy
    if not isinstance(strategy, str):
        raise ConfigError(f"strategy must be a name or a Strategy instance, got {type(strategy).__name__}")
    choose("strategy", strategy, ["auto", *STRATEGIES])
    if devices == "auto":
        devices = (
            torch.cuda.device_count()
            if accelerator in ("auto", "cuda", "gpu") and torch.cuda.is_available()
            else 1
        )
        devices = max(devices, 1)
    if strategy == "auto":
        strategy = "single" if devices == 1 else "ddp"
    if strategy == "single":
        if devices != 1:
            raise ConfigError(
                f"strategy='single' runs on one device but devices={devices}; use strategy='ddp' or 'dp'."
            )
        return SingleDeviceStrategy(accelerator=accelerator, precision=precision)
    extra = {k: v for k, v in kwargs.items() if not (k == "num_nodes" and v == 1)}
    return _load(strategy)(accelerator=accelerator, devices=devices, precision=precision, **extra)


__all__ = ["STRATEGIES", "Precision", "SingleDeviceStrategy", "Strategy", "register", "resolve_strategy"]
