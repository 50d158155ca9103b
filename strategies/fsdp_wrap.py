"""Which modules of a task become FSDP units, and sharding them bottom-up with torch's ``fully_shard``."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
from torch import nn

from tandem_core.errors import ConfigError, DistributedError

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

STEPS = ("training_step", "validation_step", "test_step", "predict_step")


def check_supported(task: nn.Module) -> None:
    """Refuse modules that cannot live inside FSDP: a DataParallel or DDP wrapper inside the task."""
    for name, module in task.named_modules():
        if isinstance(module, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
            raise ConfigError(
                f"{name or 'the task'} is a {type(module).__name__}; strategy='fsdp' distributes the task "
                "itself and cannot contain another data-parallel wrapper. Use the wrapped module directly."
            )


def resolve_classes(wrap: list[type[nn.Module] | str], task: nn.Module) -> tuple[type[nn.Module], ...]:
    """The module classes `wrap` names: classes, "pkg.module.Class" (imported) or "Class" (a class of a
    module of the task); each must occur in the task."""
    present = {c.__name__: c for m in task.modules() for c in type(m).__mro__ if issubclass(c, nn.Module)}
    classes = []
    for item in wrap:
        if isinstance(item, type) and issubclass(item, nn.Module):
            classes.append(item)
        elif isinstance(item, str) and "." in item:
            module, _, name = item.rpartition(".")
            try:
                classes.append(getattr(importlib.import_module(module), name))
            except (ImportError, AttributeError) as e:
                raise ConfigError(f"FSDPStrategy(wrap=[{item!r}]): cannot import it ({e}).") from e
        elif isinstance(item, str) and item in present:
            classes.append(present[item])
        else:
            raise ConfigError(
                f"FSDPStrategy(wrap=[{item!r}]): not a module class of the task. Its module classes are: "
                f"{sorted({type(m).__name__ for m in task.modules()})}."
            )
    missing = [
        c.__name__ for c in classes if not any(isinstance(m, c) for m in task.modules() if m is not task)
    ]
    if missing:
        raise ConfigError(
            f"FSDPStrategy(wrap=...): the task has no submodule of class {missing}; its module classes are: "
            f"{sorted({type(m).__name__ for m in task.modules() if m is not task})}."
        )
    return tuple(classes)


def choose_units(
    task: nn.Module, classes: tuple[type[nn.Module], ...] | None, min_params: int
) -> list[nn.Module]:
    """Submodules to shard as their own units, children before parents: instances of `classes`, or else
    every module holding >= min_params parameters outside the units chosen inside it. A module sharing a
    parameter with a module outside it (tied weights) is left to its parent."""
    tied = _tied_outside(task)
    units: list[nn.Module] = []
    skipped: list[str] = []

    def visit(name: str, module: nn.Module) -> int:
        free = sum(p.numel() for p in module.parameters(recurse=False))
        for child_name, child in module.named_children():
            free += visit(f"{name}.{child_name}" if name else child_name, child)
        wanted = isinstance(module, classes) if classes else free >= min_params
        if module is task or not wanted or type(module).forward is nn.Module.forward:
            # (a container without forward, a ModuleList: fully_shard cannot hook it; its parameters go up)
            return free
        if module in tied:
            skipped.append(name)
            return free
        units.append(module)
        return 0

    visit("", task)
    if skipped:
        warnings.warn(
            f"FSDP: {skipped} share parameters with modules outside them; left to the parent unit.",
            stacklevel=3,
        )
    return units


def _tied_outside(task: nn.Module) -> set[nn.Module]:
    """Modules that share a parameter with a module outside their subtree."""
    owners: dict[int, set[nn.Module]] = {}
    for module in task.modules():
        for p in module.parameters(recurse=False):
            owners.setdefault(id(p), set()).add(module)
    shared = [mods for mods in owners.values() if len(mods) > 1]
    out: set[nn.Module] = set()
    if shared:
        for module in task.modules():
            inside = set(module.modules())
            if any(mods & inside and mods - inside for mods in shared):
                out.add(module)
    return out


def shard_task(
    task: nn.Module,
    mesh: DeviceMesh,
    wrap: list[type[nn.Module] | str] | None,
    min_params: int,
    reshard_after_forward: bool,
    param_dtype: torch.dtype | None,
    cpu_offload: bool,
) -> list[str]:
    """Shard the task in place: its units, then the task as the root (whose step methods run FSDP's
    forward hooks, as forward does). Returns the names of the units ("" is the root)."""
    from torch.distributed.fsdp import (
        CPUOffloadPolicy,
        FSDPModule,
        MixedPrecisionPolicy,
        OffloadPolicy,
        fully_shard,
        register_fsdp_forward_method,
    )
    from torch.distributed.tensor import DTensor

    policy = MixedPrecisionPolicy(
        param_dtype=param_dtype, reduce_dtype=torch.float32 if param_dtype else None
    )
    kwargs = dict(
        mesh=mesh, mp_policy=policy, offload_policy=CPUOffloadPolicy() if cpu_offload else OffloadPolicy()
    )
    if not any(isinstance(m, FSDPModule) for m in task.modules()):  # configure_model did not shard it itself
        classes = resolve_classes(wrap, task) if wrap else None
        for unit in choose_units(task, classes, min_params):
            fully_shard(unit, reshard_after_forward=reshard_after_forward, **kwargs)
    fully_shard(task, **kwargs)  # the root keeps its parameters gathered from forward to backward
    for step in STEPS:
        register_fsdp_forward_method(task, step)
    left = [n for n, p in task.named_parameters() if not isinstance(p, DTensor)]
    if left:
        raise DistributedError(
            f"FSDP left parameters {left[:5]} unsharded; create them inside the task's modules."
        )
    return [name for name, m in _fsdp_modules(task)]


def _fsdp_modules(task: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    from torch.distributed.fsdp import FSDPModule

    return ((n, m) for n, m in task.named_modules() if isinstance(m, FSDPModule))
