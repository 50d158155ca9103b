"""Running one rank's set-up and training step on fake tensors, in a fake process group: the strategy's own code
(fully_shard, the DDP reducer, ZeRO, DTensor plans) runs as it would on that rank, every collective does nothing,
and no tensor gets memory. What it would allocate is counted by strategies/memory/tracker.py.

A pipeline rank cannot run its schedule so (its stages ask their neighbours for shapes), so `pipeline_step`
replays what the schedule does on this rank: the micro-batches' forwards of its stages (the inputs made by
running the earlier stages on the meta device), kept in flight as the schedule keeps them, then their backwards.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from tandem_core.errors import ConfigError

if TYPE_CHECKING:
    from strategies.memory.tracker import LiveBytes
    from strategies.pipeline import PipelineStrategy

_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


#: collectives that, on gloo, stage the whole (unsharded) tensor in a temporary of its size (measured: a
#: reduce-scatter of a 16 MB input and an all-gather into a 16 MB output each allocate 16 MB more); NCCL works in
#: place. FSDP's all-gathers and reduce-scatters are these. The temporary lives while the collective runs: counted
#: at torch's CPU allocator on every thread (strategies/memory/allocator.py), a rehearsal that frees it when the
#: collective returns predicts fsdp's measured peaks (gpt at 2 ranks: 141.1 MiB both); one that kept the last of
#: each kind alive until the next (fitted to the profiler's records, which missed gloo's worker threads) was 22%
#: over.
_GLOO_STAGED = (
    "all_gather_single",
    "all_gather_into_tensor",
    "reduce_scatter_single",
    "reduce_scatter_tensor",
)


def _staged(original: Any) -> Any:
    def collective(*args: Any, **kwargs: Any) -> Any:
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        staging = torch.empty_like(max(tensors, key=lambda t: t.numel()))  # noqa: F841 (held while it runs)
        return original(*args, **kwargs)

    return collective


@contextlib.contextmanager
def fake_world(rank: int, world_size: int, local_world_size: int, gloo: bool = True) -> Iterator[None]:
    """This process as `rank` of `world_size` in torch's fake process group (collectives do nothing; object
    collectives answer as if every rank sent what this one did), with the launcher's variables set. `gloo`:
    the collectives that stage whole tensors on gloo allocate that staging as they would there."""
    if dist.is_initialized():
        raise ConfigError(
            "the memory plan simulates each rank in a fake process group, so it runs outside any job: call it "
            "before Trainer.fit (or with `tandem plan`), not inside a distributed run."
        )
    import torch.testing._internal.distributed.fake_pg  # noqa: F401 (registers the "fake" backend)

    saved = {k: os.environ.get(k) for k in _ENV}
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank % local_world_size),
        LOCAL_WORLD_SIZE=str(local_world_size), MASTER_ADDR="127.0.0.1", MASTER_PORT="1",
    )  # fmt: skip
    patches = {
        "all_gather_object": lambda out, obj, group=None: out.__setitem__(slice(None), [obj] * len(out)),
        "broadcast_object_list": lambda objs, src=0, group=None, device=None, group_src=None: None,
        "gather_object": lambda obj, out=None, dst=0, group=None, group_dst=None: (
            out.__setitem__(slice(None), [obj] * len(out)) if out is not None else None
        ),
    }
    if gloo:
        patches.update({name: _staged(getattr(dist, name)) for name in _GLOO_STAGED if hasattr(dist, name)})
    originals = {name: getattr(dist, name) for name in patches}
    from torch.distributed.device_mesh import DeviceMesh

    meshes = {name: getattr(DeviceMesh, name) for name in ("__init__", "__getitem__")}
    dist.init_process_group("fake", store=dist.HashStore(), rank=rank, world_size=world_size)
    for name, fn in patches.items():
        setattr(dist, name, fn)
    for name, fn in meshes.items():
        setattr(DeviceMesh, name, _outside_modes(fn))
    try:
        yield
    finally:
        for name, fn in meshes.items():
            setattr(DeviceMesh, name, fn)
        _forget_meshes()
        for name, fn in originals.items():
            setattr(dist, name, fn)
        dist.destroy_process_group()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _forget_meshes() -> None:
    """Empty DTensor's sharding caches: a mesh compares equal to the next rehearsal's mesh of the same shape, so a
    cached answer would hand that rehearsal this one's mesh, whose process groups no longer exist."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.debug import _clear_sharding_prop_cache

    _clear_sharding_prop_cache()  # torch's own: the Python and the C++ fast path's
    type(DTensor._op_dispatcher.sharding_propagator)._propagate_tensor_meta_cached.cache_clear()


def _outside_modes(fn: Any) -> Any:
    """`fn` run with the fake-tensor mode (and the tracker) off: making or slicing a device mesh computes on
    the mesh's own small tensor of ranks, which a fake tensor cannot answer."""

    def outside(*args: Any, **kwargs: Any) -> Any:
        from torch.utils._python_dispatch import _disable_current_modes

        with _disable_current_modes():
            return fn(*args, **kwargs)

    return outside


def fake_copy(batch: Any, mode: Any, live: LiveBytes) -> Any:
    """`batch` with every tensor replaced by a fake one of its shape (counted by `live`, as the loader's)."""
    from strategies.batch import apply_to_tensors

    def convert(t: torch.Tensor) -> torch.Tensor:
        fake = mode.from_tensor(t)
        live.track(fake)
        return fake

    return apply_to_tensors(batch, convert)


def _meta_outputs(stages: list[torch.nn.Module], upto: int, x: torch.Tensor) -> torch.Tensor:
    """The input of stage `upto`: `x` through stages 0..upto-1 on the meta device (shapes only)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily(), torch.no_grad():
        out = torch.empty(x.shape, dtype=x.dtype, device="meta")
        for module in stages[:upto]:
            module = module if all(p.is_meta for p in module.parameters()) else _meta_twin(module)
            out = module(out)
    return out


def _meta_twin(module: torch.nn.Module) -> torch.nn.Module:
    import copy

    twin = copy.deepcopy(module)
    return twin.to("meta")


def in_flight(schedule: str, pp: int, rank: int, n_micro: int, per_rank: int) -> int:
    """How many micro-batches a stage of pipeline rank `rank` holds activations for at once: all of them
    under GPipe; under 1F1B the warm-up forwards plus one; interleaved, the looped warm-up (as torch's
    ScheduleInterleaved1F1B counts it) spread over the rank's stages."""
    if schedule == "GPipe":
        return n_micro
    if schedule == "1F1B":
        return min(n_micro, pp - rank)
    warmup = (per_rank - 1) * pp + 2 * (pp - 1 - rank) + 1
    return min(n_micro, -(-warmup // per_rank))


def pipeline_step(strategy: PipelineStrategy, task: Any, batch: Any, buffers: dict[Any, Any]) -> None:
    """One training step of this pipeline rank, as its schedule runs it, on fake tensors. `buffers` (kept by the
    caller from step to step) holds what a stage allocates once and keeps: a receive buffer per micro-batch for
    its inputs (every stage but the first) and for its output's gradients (every stage but the last). The last
    stage keeps every micro-batch's output until the step ends (the schedule returns them)."""
    stages = list(task.configure_pipeline())
    x, y = batch
    n = strategy.n_microbatches
    xs, ys = x.chunk(n), y.chunk(n)
    keep = in_flight(
        strategy.schedule_name, strategy.pipeline_parallel_size, strategy.pp_rank, n, strategy.stages_per_rank
    )
    last = strategy.n_stages - 1
    for p in task.parameters():
        p.grad = None
    outputs: list[torch.Tensor] = []
    for i in strategy.stage_indices:
        module = stages[i]
        pending: list[tuple[torch.Tensor, torch.Tensor]] = []
        for m in range(n):
            if i > 0 and ("in", i, m) not in buffers:
                buffers["in", i, m] = torch.empty_like(_meta_outputs(stages, i, xs[m]), device=x.device)
            inp = xs[m] if i == 0 else buffers["in", i, m].detach().requires_grad_(True)
            out = module(inp)
            if i == last:
                outputs.append(out)
                pending.append((task.pipeline_loss(out, ys[m]) / n, torch.ones(())))
            else:
                if ("grad", i, m) not in buffers:
                    buffers["grad", i, m] = torch.empty_like(out)
                pending.append((out, buffers["grad", i, m]))
            if len(pending) >= keep:
                out_, grad = pending.pop(0)
                out_.backward(grad)
        while pending:
            out_, grad = pending.pop(0)
            out_.backward(grad)
    del outputs
