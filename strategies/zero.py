"""ZeRO-1 on our DDP reducer: each rank keeps the optimizer state of only its share of the parameters.

`DDPStrategy(zero=1)` (strategy="ddp_zero1"). The Reducer averages the gradients as usual; then, instead of every
rank stepping the task's optimizer over all parameters, a `torch.distributed.optim.ZeroRedundancyOptimizer`
built from it (same class, same param groups, same hyperparameters) steps only the parameters assigned to this
rank and broadcasts the updated ones. The task's own optimizer stays the object the loop, `self.optimizers()`
and the LR schedulers hold: it owns the hyperparameters (a scheduler's lr change is copied into the ZeRO
twin before every step) and no state. Checkpoints are consolidated on rank 0 in the plain optimizer's
own `state_dict()` form, so a run resumes at any world size, or without ZeRO.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from strategies import group_exit
from strategies.checkpoint.io import TorchCheckpointIO
from tandem_core.errors import ConfigError

if TYPE_CHECKING:
    from torch.distributed.optim import ZeroRedundancyOptimizer

    from strategies.comm import Comm

__all__ = ["ShardedOptimizers", "ZeroCheckpointIO", "state_bytes"]


class ShardedOptimizers:
    """The ZeroRedundancyOptimizer twin of each of the task's optimizers, built on first use."""

    def __init__(self) -> None:
        self._twins: dict[int, tuple[torch.optim.Optimizer, ZeroRedundancyOptimizer]] = {}
        # each twin holds the process group: dropped at exit, before the group closes (strategies/group_exit.py)
        group_exit.on_close(self.release)

    def release(self) -> None:
        """Drop the ZeRO twins (and with them their process group); at exit only: a later save or step would
        rebuild them without their state."""
        self._twins.clear()

    def twin(self, optimizer: torch.optim.Optimizer) -> ZeroRedundancyOptimizer:
        """The ZeRO optimizer stepping `optimizer`'s parameters (made on every rank the first time: the
        partition is computed locally, identically on every rank, from the parameters' sizes)."""
        found = self._twins.get(id(optimizer))
        if found is not None and found[0] is optimizer:
            return found[1]
        from torch.distributed.optim import ZeroRedundancyOptimizer

        if optimizer.state:
            raise ConfigError(
                f"DDPStrategy(zero=1) cannot shard {type(optimizer).__name__}: it already holds state (was it "
                "stepped before fit?). Build it in configure_optimizers."
            )
        groups = [dict(g) for g in optimizer.param_groups]  # every hyperparameter rides in the groups
        try:
            zero = ZeroRedundancyOptimizer(groups, optimizer_class=type(optimizer), **_accepted(optimizer))
        except (TypeError, ValueError, RuntimeError) as e:
            raise ConfigError(
                f"DDPStrategy(zero=1) could not rebuild {type(optimizer).__name__} as a ZeroRedundancyOptimizer "
                f"({type(e).__name__}: {e}); its constructor must accept its own `defaults` as keywords. Use "
                "zero=0 for this optimizer."
            ) from e
        self._twins[id(optimizer)] = (optimizer, zero)
        return zero

    def step(self, optimizer: torch.optim.Optimizer, closure: Callable[[], Any] | None, **kwargs: Any) -> Any:
        """Step `optimizer`'s ZeRO twin with the task optimizer's current hyperparameters (`kwargs`: the
        optimizer step's own keywords)."""
        zero = self.twin(optimizer)
        sync_hyperparameters(optimizer, zero)
        out = zero.step(closure, **kwargs) if closure is not None else zero.step(**kwargs)
        optimizer._opt_called = True  # type: ignore[attr-defined]  # what LR schedulers check it stepped
        return out

    def local_state_bytes(self) -> int:
        """Bytes of optimizer state this rank holds (its share of every optimizer)."""
        return sum(state_bytes(zero.optim) for _, zero in self._twins.values())

    def local_optimizers(self) -> list[torch.optim.Optimizer]:
        """The optimizers that hold this rank's share of the state (one per task optimizer stepped so far)."""
        return [zero.optim for _, zero in self._twins.values()]


def _accepted(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's defaults that its constructor takes as keywords (AdamW's defaults hold a
    `decoupled_weight_decay` it fixes itself)."""
    params = inspect.signature(type(optimizer).__init__).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return dict(optimizer.defaults)
    return {k: v for k, v in optimizer.defaults.items() if k in params}


def sync_hyperparameters(source: torch.optim.Optimizer, target: torch.optim.Optimizer) -> None:
    """Copy every param group's hyperparameters (lr, betas, ...; not the params) from source to target."""
    for mine, theirs in zip(source.param_groups, target.param_groups):
        theirs.update({k: v for k, v in mine.items() if k != "params"})


def state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the tensors in an optimizer's per-parameter state."""
    return sum(
        v.numel() * v.element_size()
        for s in optimizer.state.values()
        if s
        for v in s.values()
        if isinstance(v, torch.Tensor)
    )


class ZeroCheckpointIO(TorchCheckpointIO):
    """One file, as the default, with every optimizer state consolidated on rank 0 in the task optimizer's
    own form (`consolidate_state_dict(to=0)`, a collective: every rank calls `collect`). Restoring gives each
    rank the state of the parameters its ZeRO twin owns at the current world size."""

    def __init__(self, optimizers: ShardedOptimizers, comm: Comm) -> None:
        self._optimizers, self._comm = optimizers, comm

    def collect(
        self, task: torch.nn.Module, optimizers: list[torch.optim.Optimizer] | None
    ) -> dict[str, Any]:
        out: dict[str, Any] = {"state_dict": task.state_dict()}
        if optimizers is None:
            return out
        states = []
        for opt in optimizers:
            zero = self._optimizers.twin(opt)
            zero.consolidate_state_dict(to=0)
            if self._comm.is_global_zero:
                state = zero.state_dict()
                # the hyperparameters are the task optimizer's (a scheduler may have changed them since the
                # last step copied them over); the params' numbering is the same (same groups, same order)
                state["param_groups"] = opt.state_dict()["param_groups"]
                states.append(state)
                zero._all_state_dicts = []  # (rank 0 would hold the whole state until the next save)
            else:
                states.append({})
        out["optimizer_states"] = states
        return out

    def load_file(
        self,
        ckpt: dict[str, Any],
        task: torch.nn.Module,
        optimizers: list[torch.optim.Optimizer] | None,
        weights: bool = True,
    ) -> None:
        """The weights as the default; each optimizer's hyperparameters into the task's optimizer, its state
        (only this rank's share is kept) into the ZeRO twin."""
        super().load_file(ckpt, task, None, weights)
        for opt, state in zip(optimizers or [], ckpt.get("optimizer_states", [])):
            opt.load_state_dict({"state": {}, "param_groups": state["param_groups"]})
            zero = self._optimizers.twin(opt)
            # ZeRO's load replaces the entries of other ranks' parameters by None: give it a copy
            zero.load_state_dict({"state": dict(state["state"]), "param_groups": state["param_groups"]})
            zero.state.clear()  # (its load kept a second copy of this rank's share there; step never reads it)
