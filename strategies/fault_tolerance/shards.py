"""Weights and optimizer states between replica groups: sharded (DTensor, FSDP inside a group) values travel
as this rank's local shard, and are put back into the same shard of the receiving rank; plain tensors as
they are. Rank r of one group and rank r of another hold the same shard (the same mesh inside each group)."""

from __future__ import annotations

from typing import Any

import torch


def _dtensor() -> type | None:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - torch without distributed
        return None
    return DTensor


def to_local(obj: Any) -> Any:
    """`obj` with every DTensor replaced by its local shard, detached (containers rebuilt, the rest kept)."""
    dtensor = _dtensor()
    if dtensor is not None and isinstance(obj, dtensor):
        return obj.to_local().detach()
    if isinstance(obj, dict):
        return {k: to_local(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_local(v) for v in obj)
    return obj


def load_weights(task: torch.nn.Module, received: dict[str, Any]) -> None:
    """Copy the received weights into the task's own tensors (its local shards where they are sharded)."""
    own = task.state_dict()
    missing, unexpected = sorted(set(own) - set(received)), sorted(set(received) - set(own))
    if missing or unexpected:
        raise KeyError(f"missing {missing[:5]}, unexpected {unexpected[:5]}")
    with torch.no_grad():
        for name, value in own.items():
            _local(value).copy_(received[name])


def load_optimizer(optimizer: torch.optim.Optimizer, received: dict[str, Any]) -> None:
    """Load the received optimizer state; per-parameter tensors shaped like a sharded parameter's local shard
    become DTensors of that parameter's layout again, as the optimizer keeps them."""
    dtensor = _dtensor()
    params = [p for group in optimizer.param_groups for p in group["params"]]
    state = {}
    for index, values in received.get("state", {}).items():
        param = params[int(index)]
        if dtensor is not None and isinstance(param, dtensor):
            values = {k: _as_shard(v, param, dtensor) for k, v in values.items()}
        state[index] = values
    optimizer.load_state_dict({**received, "state": state})


def _as_shard(value: Any, param: Any, dtensor: type) -> Any:
    if isinstance(value, torch.Tensor) and value.shape == param.to_local().shape and value.dim() > 0:
        return dtensor.from_local(
            value.to(param.device),
            param.device_mesh,
            param.placements,
            run_check=False,
            shape=param.shape,
            stride=param.stride(),
        )
    return value


def _local(t: torch.Tensor) -> torch.Tensor:
    dtensor = _dtensor()
    return t.to_local() if dtensor is not None and isinstance(t, dtensor) else t
