"""A pipeline rank's part of the task: its own stages on its device (fully sharded over the data-parallel ranks
when there are several), every other stage on the meta device, and never the whole task anywhere."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

from strategies.checkpoint.checks import check_compatible
from strategies.large.init import materialize, move_materialized, recast, sync_replicas
from strategies.large.weights import REMEDY, broadcast_into, covered, take
from tandem_core.errors import TaskError

if TYPE_CHECKING:
    import torch
    from torch.distributed.device_mesh import DeviceMesh

    from strategies.precision import Precision


def reuse_stages(modules: list[nn.Module], placed: dict[int, nn.Module]) -> list[nn.Module]:
    """`modules` (configure_pipeline()'s stages, whose containers are often built afresh on every call) with each
    stage that this rank sharded before (`placed`, by index: the same Trainer's previous stage) in place of a new
    container holding the same parameters (a stage never sharded is taken as returned now): fully_shard made the old one the stage's sharded unit, and its
    parameters sharded ones, which cannot be sharded again. A stage whose parameters are sharded already but
    whose container is new with other parameters (another split, or another Trainer) is a TaskError; a sharded
    container returned again (one the task keeps) is its own unit already."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    out = []
    for i, module in enumerate(modules):
        old = placed.get(i)
        params = [id(p) for p in module.parameters()]
        if isinstance(old, FSDPModule) and old is not module and params == [id(p) for p in old.parameters()]:
            module = old
        elif not isinstance(module, FSDPModule) and any(isinstance(p, DTensor) for p in module.parameters()):
            raise TaskError(
                f"configure_pipeline() stage {i} holds parameters that a PipelineStrategy sharded already (with "
                "data_parallel_size > 1), in a container this Trainer did not set up: return the same stages (the "
                "same modules, in the same order) on every call, and run validate/test/predict after a fit with "
                "the Trainer that ran it (or a task built afresh, loaded from its checkpoint)."
            )
        out.append(module)
    return out


def place_stages(
    task: nn.Module,
    modules: list[nn.Module],
    indices: list[int],
    mesh: DeviceMesh,
    device: torch.device,
    precision: Precision,
) -> None:
    """Stages `indices` of `modules` (the task's configure_pipeline()) on `device` in the precision's dtype,
    sharded over mesh["dp"] when it has several ranks; the others on meta. What was built on meta is
    materialized here (each rank only its stages' shards); weights waiting on the task are loaded."""
    import torch.distributed as dist

    local = [modules[i] for i in indices]
    mine = {id(m) for m in local}
    for module in modules:  # free what other ranks compute: only this rank's stages keep parameters
        if id(module) not in mine and not all(t.is_meta for t in [*module.parameters(), *module.buffers()]):
            module.to("meta")
    dp = mesh["dp"]
    sharded = dp.size() > 1
    dtype = precision.param_dtype
    names = {id(m): n for n, m in task.named_modules()}
    wanted = covered(task)
    for module in local:
        recast(module, dtype)  # where it is (meta stays meta)
        if sharded:
            from torch.distributed.fsdp import FSDPModule, fully_shard

            if isinstance(module, FSDPModule):  # a stage set up before (reuse_stages): sharded already; an
                module.reshard()  # evaluation's forward leaves it unsharded: the optimizer must get the shards
            else:
                fully_shard(module, mesh=dp)
        replicas = (lambda m: sync_replicas(m, dp.get_group())) if sharded else None
        materialize(module, device, wanted, sharded, replicas, qualnames=names)
    move_materialized(task, device, dtype)
    found = take(task)
    if found is not None:
        if found.strict:
            check_compatible(task, found.state_dict, found.source, REMEDY)
        state = found.state_dict if dist.get_rank() == 0 else {}
        broadcast_into(task, state, found.strict, device if device.type == "cuda" else None)
