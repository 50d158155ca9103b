"""Strategies: single device, threaded DataParallel, our bucketed-overlap DDP, and FSDP on torch's fully_shard."""

from __future__ import annotations

import importlib
from typing import Any

import torch

from strategies import group_exit  # noqa: F401 (registers the closing of process groups at exit)
from strategies.base import Strategy
from strategies.comm import Comm
from strategies.environments.detect import detect as detect_environment
from strategies.names import FORK_NAMES, REFUSED, STRATEGIES
from strategies.parallel import ParallelStrategy
from strategies.plugins import apply_plugins
from strategies.precision import Precision
from strategies.single import SingleDeviceStrategy
from tandem_core.errors import ConfigError

#: Trainer options a strategy takes when its constructor left them unset
FILLED = ("accelerator", "precision", "devices", "num_nodes", "sync_batchnorm")
DEFAULTS = {  # TrainerConfig's defaults (kept equal by tests/test_strategy_base.py; importing trainer.options
    # here would close an import cycle through its checks, which look strategies up)
    "accelerator": "auto",
    "precision": "32-true",
    "devices": "auto",
    "num_nodes": 1,
    "sync_batchnorm": False,
}


def register(name: str, target: str, **kwargs: Any) -> None:
    """Make a strategy available by name in Trainer(strategy=...) and in config files (Lightning's way:
    ``StrategyRegistry.register(name, cls, **init_params)``, strategies/registry.py)."""
    STRATEGIES[name] = (target, kwargs)


def _load(name: str) -> tuple[type[Strategy], dict[str, Any]]:
    from strategies.registry import strategy_class

    target, kwargs = STRATEGIES[name]
    return strategy_class(target), kwargs


def resolve_strategy(
    strategy: Any, options: dict[str, Any], given: set[str] | frozenset[str] = frozenset()
) -> Strategy:
    """Turn Trainer(strategy=..., devices=..., ...) into a configured Strategy instance.

    `options` holds the Trainer's accelerator, precision, devices, num_nodes and use_distributed_sampler;
    `given` names those the user passed. A Strategy instance keeps what its constructor set and takes the
    rest from the Trainer; a value set on both sides that differs is a ConfigError naming both.
    """
    if isinstance(strategy, str):  # (trainer/options.py checked the name)
        strategy = _by_name(strategy.lower(), options)
    apply_plugins(strategy, options.get("plugins"), options, given)
    for name in FILLED:
        value = options.get(name, DEFAULTS[name])
        if name == "devices" and value == "auto":  # "auto" fills an unset count but never conflicts
            value, given = _auto_devices(options), set(given) - {"devices"}
        if name == "precision" or hasattr(strategy, name):  # (reading .precision would default it)
            strategy._fill(name, value, name in given)
        elif name in ("devices", "num_nodes") and name in given and value != 1:  # for a one-device strategy
            raise ConfigError(
                f"{type(strategy).__name__} runs in one process on one device but {name}={options[name]!r}; "
                "use strategy='ddp' (or 'dp' for several devices in one process)."
            )
    if getattr(strategy, "cluster_environment", False) is None:  # a parallel strategy: from the variables
        strategy.cluster_environment = detect_environment()
    if hasattr(strategy, "set_world_ranks"):
        strategy.set_world_ranks()
    strategy.use_distributed_sampler = options.get("use_distributed_sampler", True)
    strategy._overfit_batches = options.get("overfit_batches", 0)  # distributed samplers do not shuffle then
    strategy.root_device  # noqa: B018 (a missing accelerator is a ConfigError now, not at fit)
    return strategy


def _auto_devices(options: dict[str, Any]) -> int:
    cuda = options.get("accelerator", "auto") in ("auto", "cuda", "gpu") and torch.cuda.is_available()
    return max(torch.cuda.device_count() if cuda else 1, 1)


def _by_name(name: str, options: dict[str, Any]) -> Strategy:
    devices = options.get("devices", "auto")
    if devices == "auto":
        devices = _auto_devices(options)
    if name == "auto":
        name = "single" if devices == 1 and options.get("num_nodes", 1) == 1 else "ddp"
    if name in ("single", "single_device") and devices != 1:
        raise ConfigError(
            f"strategy={name!r} runs on one device but devices={devices}; use strategy='ddp' or 'dp'."
        )
    cls, kwargs = _load(name)
    return cls(**kwargs)


_LAZY = {
    "DDPStrategy": "strategies.ddp",
    "DataParallelStrategy": "strategies.data_parallel",
    "FSDPStrategy": "strategies.fsdp",
    "FaultTolerance": "strategies.fault_tolerance",
    "ModelParallelStrategy": "strategies.model_parallel",
    "PipelineStrategy": "strategies.pipeline",
    "checkpoint_modules": "strategies.large.activation",  # activation checkpointing (docs/large_models.md)
    "StrategyRegistry": "strategies.registry",
}


def __getattr__(name: str) -> Any:
    """DDPStrategy, FaultTolerance and the other strategies on first use (PEP 562), like Lightning's `from ...strategies import`."""
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'strategies' has no attribute {name!r}")


__all__ = [
    "FORK_NAMES",
    "REFUSED",
    "STRATEGIES",
    "Comm",
    "DDPStrategy",
    "DataParallelStrategy",
    "FSDPStrategy",
    "FaultTolerance",
    "ModelParallelStrategy",
    "ParallelStrategy",
    "PipelineStrategy",
    "Precision",
    "SingleDeviceStrategy",
    "Strategy",
    "checkpoint_modules",
    "StrategyRegistry",
    "register",
    "resolve_strategy",
]
