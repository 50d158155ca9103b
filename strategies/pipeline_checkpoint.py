"""PipelineStrategy's checkpoints: one file, as the default form, with every stage's weights and optimizer
state gathered to rank 0. Each rank holds only its stages' parameters (the others are on the meta device)
and every rank's optimizer numbers the task's parameters alike, so the stages' parts merge into the plain
`task.state_dict()` / `optimizer.state_dict()` forms: the file resumes under any pipeline size (or none).
With data_parallel_size > 1 (FSDP stages) the stages' shards are gathered first (`full_tensor`, a collective
every rank joins)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from strategies.checkpoint.io import TorchCheckpointIO

if TYPE_CHECKING:
    from strategies.pipeline import PipelineStrategy


def _plain(t: Any) -> Any:
    """A whole CPU tensor: DTensor shards gathered (a collective), meta tensors -> None."""
    if not isinstance(t, torch.Tensor):
        return t
    from torch.distributed.tensor import DTensor

    if isinstance(t, DTensor):
        t = t.full_tensor()
    return None if t.is_meta else t.detach().cpu()


class PipelineCheckpointIO(TorchCheckpointIO):
    """Every stage's part gathered to rank 0 (every rank calls `collect`: it is a collective). A file is read
    memory-mapped: each rank touches only its own stages' tensors."""

    mmap = True

    def __init__(self, strategy: PipelineStrategy) -> None:
        self._strategy = strategy

    @property
    def saves_window_grads(self) -> bool:  # type: ignore[override]
        return False  # no accumulation windows under a pipeline

    def collect(
        self, task: torch.nn.Module, optimizers: list[torch.optim.Optimizer] | None
    ) -> dict[str, Any]:
        comm = self._strategy.comm
        weights = {k: v for k, v in ((k, _plain(v)) for k, v in task.state_dict().items()) if v is not None}
        states = []
        for opt in optimizers or []:
            full = opt.state_dict()
            own = {i: {k: _plain(v) for k, v in s.items()} for i, s in full["state"].items()}
            states.append({"state": own, "param_groups": full["param_groups"]})
        parts = comm.gather_object((weights, states))
        out: dict[str, Any] = {"state_dict": {}}
        if optimizers is not None:
            out["optimizer_states"] = [{} for _ in optimizers]
        if not comm.is_global_zero:
            return out
        merged: dict[str, Any] = {}
        for w, _ in parts:
            merged.update(w)
        out["state_dict"] = {k: merged[k] for k in task.state_dict() if k in merged}  # the task's order
        for j in range(len(optimizers or [])):
            state: dict[int, Any] = {}
            for _, s in parts:
                state.update(s[j]["state"])
            out["optimizer_states"][j] = {
                "state": dict(sorted(state.items())),
                "param_groups": parts[0][1][j]["param_groups"],
            }
        return out

    def load_file(
        self,
        ckpt: dict[str, Any],
        task: torch.nn.Module,
        optimizers: list[torch.optim.Optimizer] | None,
        weights: bool = True,
    ) -> None:
        """Each rank copies its own stages' weights and optimizer states out of the whole ones."""
        from torch.distributed.tensor import DTensor, distribute_tensor

        own = task.state_dict()
        if weights:
            with torch.no_grad():
                for name, dst in own.items():
                    if dst.is_meta or name not in ckpt["state_dict"]:
                        continue
                    src = ckpt["state_dict"][name]
                    if isinstance(dst, DTensor):
                        src = distribute_tensor(
                            src.to(dst.device, dst.dtype), dst.device_mesh, dst.placements
                        )
                        dst.to_local().copy_(src.to_local())
                    else:
                        dst.copy_(src)
        params = [p for opt in optimizers or [] for g in opt.param_groups for p in g["params"]]
        for opt, state in zip(optimizers or [], ckpt.get("optimizer_states", [])):
            index = [p for g in opt.param_groups for p in g["params"]]
            kept = {}
            for i, s in state["state"].items():
                p = index[i]
                if p.is_meta:
                    continue
                if isinstance(p, DTensor):
                    s = {
                        k: distribute_tensor(v.to(p.device), p.device_mesh, p.placements)
                        if isinstance(v, torch.Tensor) and v.shape == p.shape
                        else v
                        for k, v in s.items()
                    }
                kept[i] = s
            opt.load_state_dict({"state": kept, "param_groups": state["param_groups"]})
        del params
