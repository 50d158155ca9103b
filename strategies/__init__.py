"""Strategies: single device, threaded DataParallel, our bucketed-overlap DDP, and FSDP on torch's fully_shard."""

from __future__ import annotations

import importlib
from typing import Any

import torch

from strategies import group_exit  # noqa: F401 (registers the closing of process groups at exit)
from strategies.base import Strategy
from strategies.comm import Comm
from strategies.parallel import ParallelStrategy
from strategies.precision import Precision
from strategies.single import SingleDeviceStrategy
from tandem_core.errors import ConfigError

# name -> ("module:Class", constructor arguments); imported on demand so that `import trainer` stays fast.
STRATEGIES: dict[str, tuple[str, dict[str, Any]]] = {
    "single": ("strategies.single:SingleDeviceStrategy", {}),
    "single_device": ("strategies.single:SingleDeviceStrategy", {}),  # Lightning's name
    "dp": ("strategies.data_parallel:DataParallelStrategy", {}),
    "ddp": ("strategies.ddp:DDPStrategy", {}),
    "ddp_accumulate": ("strategies.ddp:DDPStrategy", {}),  # config alias: use with accumulate_grad_batches=k
    "ddp_find_unused_parameters_true": ("strategies.ddp:DDPStrategy", {"find_unused_parameters": True}),
    "ddp_find_unused_parameters_false": ("strategies.ddp:DDPStrategy", {"find_unused_parameters": False}),
    "ddp_zero1": ("strategies.ddp:DDPStrategy", {"zero": 1}),  # ZeRO-1: optimizer states sharded
    "pipeline": ("strategies.pipeline:PipelineStrategy", {}),
    "fsdp": ("strategies.fsdp:FSDPStrategy", {}),
    "fsdp_cpu_offload": ("strategies.fsdp:FSDPStrategy", {"cpu_offload": True}),
    "model_parallel": ("strategies.model_parallel:ModelParallelStrategy", {}),
}
# Lightning's DDP start methods: fork (notebooks) and spawn start the workers from this process (strategies/fork.py)
for _name, _method in (("fork", "fork"), ("notebook", "fork"), ("spawn", "spawn")):
    STRATEGIES[f"ddp_{_name}"] = ("strategies.ddp:DDPStrategy", {"start_method": _method})
    for _unused in (True, False):
        STRATEGIES[f"ddp_{_name}_find_unused_parameters_{str(_unused).lower()}"] = (
            "strategies.ddp:DDPStrategy",
            {"start_method": _method, "find_unused_parameters": _unused},
        )
_DEEPSPEED = (
    "DeepSpeed is not part of Tandem; use strategy='fsdp', which shards parameters, gradients and optimizer "
    "states as ZeRO stage 3 does ('fsdp_cpu_offload' or FSDPStrategy(cpu_offload=True) for the offload variants)"
)
_XLA = "TPUs/XLA are not supported by Tandem; run on CUDA or the CPU with strategy='ddp' (or 'single')"
#: Lightning's strategy names that Tandem refuses, with what to use instead
REFUSED: dict[str, str] = {
    **{
        name: f"strategy={name!r}: {_DEEPSPEED}"
        for name in (
            "deepspeed",
            "deepspeed_stage_1",
            "deepspeed_stage_2",
            "deepspeed_stage_2_offload",
            "deepspeed_stage_3",
            "deepspeed_stage_3_offload",
            "deepspeed_stage_3_offload_nvme",
        )
    },
    **{name: f"strategy={name!r}: {_XLA}" for name in ("single_tpu", "single_xla", "xla", "xla_debug")},
}
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
    """Make a strategy available by name in Trainer(strategy=...) and in config files."""
    STRATEGIES[name] = (target, kwargs)


def _load(name: str) -> tuple[type[Strategy], dict[str, Any]]:
    target, kwargs = STRATEGIES[name]
    module, _, cls = target.partition(":")
    return getattr(importlib.import_module(module), cls), kwargs


def resolve_strategy(
    strategy: Any, options: dict[str, Any], given: set[str] | frozenset[str] = frozenset()
) -> Strategy:
    """Turn Trainer(strategy=..., devices=..., ...) into a configured Strategy instance.

    `options` holds the Trainer's accelerator, precision, devices, num_nodes and use_distributed_sampler;
    `given` names those the user passed. A Strategy instance keeps what its constructor set and takes the
    rest from the Trainer; a value set on both sides that differs is a ConfigError naming both.
    """
    if isinstance(strategy, str):  # (trainer/options.py checked the name)
        strategy = _by_name(strategy, options)
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
}


def __getattr__(name: str) -> Any:
    """DDPStrategy, FaultTolerance and the other strategies on first use (PEP 562), like Lightning's `from ...strategies import`."""
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'strategies' has no attribute {name!r}")


__all__ = [
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
    "register",
    "resolve_strategy",
]
