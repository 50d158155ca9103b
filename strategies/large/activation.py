"""Activation checkpointing: chosen modules keep no activations between forward and backward; backward runs their
forward again. On torch's own ``checkpoint_wrapper`` (non-reentrant ``torch.utils.checkpoint``) and, for selective
checkpointing, ``create_selective_checkpoint_contexts``: the outputs of the named ops (the matrix products, say)
are kept and everything else inside the module is recomputed, trading less memory for less recomputation.

``FSDPStrategy(activation_checkpointing_policy={Block})`` (Lightning's option) applies it before sharding; under
model_parallel and pipeline call `checkpoint_modules` yourself, in ``configure_model`` before parallelizing or in
``configure_pipeline`` (docs/large_models.md). A module wrapped here keeps its names in ``state_dict()``; only
``named_parameters()`` show torch's ``_checkpoint_wrapped_module.`` in between.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from tandem_core.errors import ConfigError

#: what torch inserts in the names of a wrapped module's parameters
WRAPPED = "_checkpoint_wrapped_module."

Policy = (
    Any  # a set (list, tuple) of module classes or "pkg.Class" names, one class, or an FSDP auto-wrap policy
)


def resolve_ops(ops: Iterable[Any]) -> list[Any]:
    """torch ops from their objects or names: "aten.mm" (every overload), "aten.mm.default", torch.ops.aten.mm."""
    out = []
    for op in ops:
        if isinstance(op, str):
            parts = op.split(".")
            if len(parts) not in (2, 3):
                raise ConfigError(
                    f"activation checkpointing: cannot read op {op!r}; name it as 'aten.mm' or 'aten.mm.default'."
                )
            try:
                found: Any = getattr(getattr(torch.ops, parts[0]), parts[1])
                if len(parts) == 3:
                    found = getattr(found, parts[2])
            except (AttributeError, RuntimeError) as e:
                raise ConfigError(f"activation checkpointing: torch has no op {op!r} ({e}).") from e
            out.append(found)
        elif isinstance(op, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
            out.append(op)
        else:
            raise ConfigError(
                f"activation checkpointing: {op!r} is not a torch op; pass torch.ops.aten.mm.default or 'aten.mm'."
            )
    return out


def _selective(ops: list[Any]) -> Callable[[], Any]:
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    overloads = {op for op in ops if isinstance(op, torch._ops.OpOverload)}
    packets = {op for op in ops if isinstance(op, torch._ops.OpOverloadPacket)}

    def policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
        if op in overloads or getattr(op, "overloadpacket", None) in packets:
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return functools.partial(create_selective_checkpoint_contexts, policy)


def _choice(policy: Policy, model: nn.Module) -> dict[str, Any]:
    """apply_activation_checkpointing's keyword for `policy`: module classes (a set, list or one class; "pkg.Block"
    names too) or, as in Lightning, an FSDP auto-wrap policy (``ModuleWrapPolicy``, or a function
    ``(module, recurse, nonwrapped_numel) -> bool``)."""
    if isinstance(policy, type):
        policy = {policy}
    if isinstance(policy, (set, frozenset, list, tuple)):
        from strategies.fsdp_wrap import resolve_classes

        classes = resolve_classes(list(policy), model)
        return {"check_fn": lambda m: isinstance(m, classes)}
    if callable(policy):
        return {"auto_wrap_policy": policy}
    raise ConfigError(
        f"activation_checkpointing_policy={policy!r}: give a set of module classes ({{Block}}, or 'pkg.Block' "
        "names), or an FSDP auto-wrap policy (ModuleWrapPolicy)."
    )


def checkpointed(model: nn.Module) -> bool:
    """Whether some module of `model` is wrapped for activation checkpointing already."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    return any(isinstance(m, CheckpointWrapper) for m in model.modules())


def checkpoint_modules(model: nn.Module, policy: Policy, save_ops: Iterable[Any] | None = None) -> list[str]:
    """Wrap every submodule of `model` that `policy` picks (a set of module classes, or as in Lightning an FSDP
    auto-wrap policy) for activation checkpointing, in place; returns their names. `save_ops`: selective checkpointing,
    the ops whose outputs are kept (e.g. ``["aten.mm", "aten._scaled_dot_product_flash_attention"]``); None:
    everything inside is recomputed. Example, in a model_parallel task::

        def configure_model(self):
            checkpoint_modules(self.model, {Block}, save_ops=["aten.mm"])
            parallelize_module(...); fully_shard(...)
    """
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointWrapper,
        apply_activation_checkpointing,
        checkpoint_wrapper,
    )

    if checkpointed(model):
        raise ConfigError(
            f"activation checkpointing: {type(model).__name__} has modules wrapped for it already; apply it once."
        )
    kwargs: dict[str, Any] = {}
    if save_ops is not None:
        kwargs["context_fn"] = _selective(resolve_ops(save_ops))
    wrapper = functools.partial(checkpoint_wrapper, **kwargs)
    apply_activation_checkpointing(model, checkpoint_wrapper_fn=wrapper, **_choice(policy, model))
    names = [n.replace(WRAPPED, "") for n, m in model.named_modules() if isinstance(m, CheckpointWrapper)]
    if not names:
        raise ConfigError(
            f"activation checkpointing: the policy {policy!r} picks no submodule of {type(model).__name__} (the "
            "model itself is never wrapped); name the classes of its blocks."
        )
    return names
