"""Tied parameters (one Parameter reached under several names): find them, and tie them again after a move or a
load that untied them (Lightning's find_shared_parameters / set_shared_parameters)."""

from __future__ import annotations

from torch import nn


def find_shared_parameters(module: nn.Module) -> list[list[str]]:
    """Groups of names that reach the same Parameter (only groups of two or more), in module order."""
    names: dict[int, list[str]] = {}
    for name, param in module.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    return [group for group in names.values() if len(group) > 1]


def set_shared_parameters(module: nn.Module, shared_params: list[list[str]]) -> nn.Module:
    """Make every name of each group point at its first name's Parameter; returns `module`."""
    for group in shared_params:
        first = module.get_parameter(group[0])
        for path in group[1:]:
            owner, _, attr = path.rpartition(".")
            setattr(module.get_submodule(owner) if owner else module, attr, first)
    return module
