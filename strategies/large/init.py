"""Building a model without memory, and giving each rank only its part of it.

``Trainer.init_module(empty_init=...)`` enters a strategy's ``tensor_init_context`` (Lightning's names): tensors
made inside land on the strategy's device in the precision's dtype ("true" precisions), uninitialized when
`empty_init` is True; the sharding strategies (fsdp, model_parallel, pipeline) put them on the meta device
instead, so that nothing is allocated until the model is split. At setup, `materialize` allocates what is
still on meta (after sharding: only this rank's shard of each parameter, `to_empty`) and fills it with each
module's own ``reset_parameters()``, as Lightning does.
"""

from __future__ import annotations

import contextlib
import warnings
import zlib
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from strategies.precision import default_dtype
from tandem_core.errors import TaskError


class EmptyInit(TorchFunctionMode):
    """Inside, ``torch.nn.init`` functions return their tensor untouched: a module's constructor allocates
    its parameters but spends no time filling them (Lightning's ``_EmptyInit``). For weights that a
    checkpoint overwrites next."""

    def __torch_function__(self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if getattr(func, "__module__", None) == "torch.nn.init":
            return kwargs["tensor"] if "tensor" in kwargs else args[0]
        return func(*args, **kwargs)


@contextlib.contextmanager
def init_context(
    device: torch.device | str | None, dtype: torch.dtype | None, empty: bool = False
) -> Iterator[None]:
    """Tensors made inside go to `device` (None: where torch puts them), floating ones in `dtype` (None:
    unchanged), and stay uninitialized when `empty` (meta tensors are never initialized anyway)."""
    with contextlib.ExitStack() as stack:
        if device is not None:
            stack.enter_context(torch.device(device))
        if dtype is not None:
            stack.enter_context(default_dtype(dtype))
        if empty and torch.device(device or "cpu").type != "meta":
            stack.enter_context(EmptyInit())
        yield


def has_meta(module: nn.Module, recurse: bool = True) -> bool:
    """Whether any parameter or buffer of `module` is on the meta device."""
    tensors = [*module.parameters(recurse=recurse), *module.buffers(recurse=recurse)]
    return any(t.is_meta for t in tensors)


def _own_names(module: nn.Module) -> list[str]:
    return [n for n, _ in module.named_parameters(recurse=False)] + [
        n for n, _ in module.named_buffers(recurse=False)
    ]


def materialize(
    module: nn.Module,
    device: torch.device,
    covered: Collection[str] = (),
    sharded: bool = False,
    replicas: Callable[[nn.Module], None] | None = None,
    qualnames: dict[int, str] | None = None,
) -> list[str]:
    """Allocate every meta parameter and buffer of `module` on `device` (a sharded parameter: its local
    shard only) and fill it with its module's ``reset_parameters()``. Returns the names of the modules
    materialized ("" is `module` itself).

    `covered`: names (as in ``module.state_dict()``) that a checkpoint loads next: a module whose own
    tensors are all covered is allocated but not reset (it needs no ``reset_parameters``). `sharded`: the
    module's parameters are split over ranks, each of which draws only its shards; then every module draws
    from a random stream of its own, seeded by its name and by which shard this rank holds (its coordinates
    on the mesh dimensions its parameters are split along): different shards get different numbers (on a CPU
    mesh every rank would otherwise draw the same numbers for its shard, and the shards of one tensor would
    repeat each other), and ranks holding the same shard or a whole replicated tensor draw the same ones.
    The caller's random state is left as it was. `replicas(module)` then makes equal what a module's own
    reset leaves unequal (a bias replicated next to a split weight: a broadcast).
    `qualnames` maps a submodule (by id) to its name in the module `covered` names are relative to, when
    that is not `module` itself (a pipeline stage of a task). A meta module with no ``reset_parameters``
    whose tensors no checkpoint covers is a TaskError naming it.
    """
    todo = [(name, m) for name, m in module.named_modules() if has_meta(m, recurse=False)]
    if not todo:
        return []
    names = set(covered)
    reset: list[tuple[str, nn.Module]] = []
    missing = []
    for name, m in todo:
        if qualnames is not None:
            name = qualnames.get(id(m), name)
        name = name.replace("_checkpoint_wrapped_module.", "").replace("._checkpoint_wrapped_module", "")
        prefix = f"{name}." if name else ""
        if names and all(prefix + n in names for n in _own_names(m)):
            continue
        if callable(getattr(m, "reset_parameters", None)):
            reset.append((name, m))
        else:
            missing.append(f"{name or '<the task>'} ({type(m).__name__})")
    if missing:
        raise TaskError(
            f"these modules were built on the meta device (init_module(empty_init=True)) and have no "
            f"reset_parameters() to initialize their own parameters and buffers: {', '.join(missing)}. Define "
            "reset_parameters(self) on those classes (it must fill the tensors the module registers itself, "
            "without reallocating them), or load their weights from a file (Task.load_from_checkpoint or "
            "task.load_pretrained(path) inside the init_module block, or fit(ckpt_path=...)), or build the "
            "model without empty_init=True."
        )
    for _, m in todo:
        m.to_empty(device=device, recurse=False)
    with _forked(device) if sharded else contextlib.nullcontext(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*DTensor random operators may not have complete support")
        base = _common_seed() if sharded else 0
        for name, m in reset:
            if sharded:
                torch.manual_seed(_seed(base, name, _shard_coordinates(m)))
            with torch.no_grad():
                m.reset_parameters()
    if replicas is not None:
        replicas(module)
    return [name for name, _ in todo]


@contextlib.contextmanager
def _forked(device: torch.device) -> Iterator[None]:
    """torch's random state restored after the block."""
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices, device_type=device.type if devices else "cuda"):
        yield


def _common_seed() -> int:
    """Rank 0's process seed, on every rank (so that replicas agree even where the user seeded nothing)."""
    import torch.distributed as dist

    box = [torch.initial_seed()]
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(box, src=0)
    return int(box[0])


def _shard_coordinates(module: nn.Module) -> tuple[int, ...]:
    """This rank's coordinates on the mesh dimensions along which the module's first split parameter is split
    (() when none is)."""
    from torch.distributed.tensor import DTensor, Shard

    for t in module.parameters(recurse=False):
        if isinstance(t, DTensor):
            where = t.device_mesh.get_coordinate() or []
            return tuple(c for c, p in zip(where, t.placements) if isinstance(p, Shard) or p.is_shard())
    return ()


def _seed(base: int, name: str, coordinates: tuple[int, ...]) -> int:
    """A seed from the process's seed, a module's name and a shard's coordinates (the same on every rank)."""
    return (base + zlib.crc32(f"{name}|{coordinates}".encode())) % 2**63


def sync_replicas(module: nn.Module, plain_group: Any = None) -> None:
    """Make the copies of a tensor that several ranks hold equal to the first rank's: along each mesh
    dimension where a DTensor is replicated, and across `plain_group` for plain tensors (None: world)."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor, Replicate

    with torch.no_grad():
        for t in [*module.parameters(), *module.buffers()]:
            if isinstance(t, DTensor):
                mesh = t.device_mesh
                for dim, placement in enumerate(t.placements):
                    if isinstance(placement, Replicate) and mesh.size(dim) > 1:
                        group = mesh.get_group(dim)
                        dist.broadcast(t.to_local(), src=dist.get_global_rank(group, 0), group=group)
            elif dist.get_world_size(plain_group) > 1 and not t.is_meta:
                src = 0 if plain_group is None else dist.get_global_rank(plain_group, 0)
                dist.broadcast(t.data, src=src, group=plain_group)


def misplaced(module: nn.Module, device: torch.device, dtype: torch.dtype | None) -> bool:
    """Whether `module.to(device, dtype)` would change anything (a floating tensor in another dtype, or any
    tensor elsewhere)."""
    for t in [*module.parameters(), *module.buffers()]:
        if t.device != device or (dtype is not None and t.is_floating_point() and t.dtype != dtype):
            return True
    return False


def recast(module: nn.Module, dtype: torch.dtype | None) -> None:
    """`module.to(dtype=dtype)` where it is (meta stays meta), only when a floating tensor has another dtype."""
    tensors = [*module.parameters(), *module.buffers()]
    if dtype is not None and any(t.is_floating_point() and t.dtype != dtype for t in tensors):
        module.to(dtype=dtype)


def move_materialized(module: nn.Module, device: torch.device, dtype: torch.dtype | None) -> None:
    """`module.to(device, dtype)` for every tensor not on the meta device (those stay there)."""

    def move(t: torch.Tensor) -> torch.Tensor:
        if t.is_meta:
            return t
        return t.to(device, dtype) if dtype is not None and t.is_floating_point() else t.to(device)

    real = [t for t in [*module.parameters(), *module.buffers()] if not t.is_meta]
    if any(
        t.device != device or (dtype is not None and t.is_floating_point() and t.dtype != dtype) for t in real
    ):
        module._apply(move)
