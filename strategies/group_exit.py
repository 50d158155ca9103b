"""Closing the process group at interpreter exit, whoever made it (Tandem, torchrun's env://, the user's own
`init_process_group` before `fit`), so that a run that succeeded exits 0.

Why: dropping the last reference to a gloo group joins its worker threads (torch releases the GIL for that),
and each worker first frees the tensors of its last collective, which needs the GIL. A group still alive at
interpreter shutdown leaves that to a worker after Python stopped handing out the GIL: the process aborts
("terminate called without an active exception", exit -6) after a good run. So at exit the group is
destroyed, and then every reference that would keep the closed group alive is dropped, so the last one goes
while the interpreter is whole:

- `torch.distributed.nn.functional`'s functions take `group=group.WORLD` as a default argument, evaluated
  when it was imported: imported after the group was made (a user's group made before `fit`; building an
  optimizer imports it through torch._dynamo), they hold it. Those defaults become None (the default group,
  which is what the functions document).
- A DeviceMesh (FSDP's) keeps its groups in `_pg_registry` (for torch.compile tracing), and the mesh itself
  outlives the model in torch's DTensor caches (the sharding propagator's, per thread). After
  `destroy_process_group` every group is closed, so those registries are emptied.

The handler is registered when `strategies` is imported (importing Trainer does it), before a script's own
`atexit.register(dist.destroy_process_group)`: atexit runs last-in first-out, so the script's handler runs
first and this one then finds the group closed and only drops the references. It acts only in a process
where a fit joined a group (`joined`): a single-device run pays nothing at exit.
"""

from __future__ import annotations

import atexit
import gc
import sys
from typing import Any

_joined = False  # a fit joined a process group in this process (ours, torchrun's or the user's)


def joined() -> None:
    """Called when a fit joins a process group: from then on, exit has a group to close. A process that never
    joined one (a single-device run) pays nothing at exit, and a group Tandem never used is left alone."""
    global _joined
    _joined = True


def close_groups() -> int:
    """Close the default group (if open) and drop the references that keep closed groups alive. Returns how
    many closed gloo groups are still referenced from somewhere else afterwards (their workers cannot be
    joined now: said on stderr)."""
    dist = sys.modules.get("torch.distributed")
    if not _joined or dist is None or not dist.is_available():
        return 0
    world = dist.group.WORLD if dist.is_initialized() else None
    if world is not None:
        dist.destroy_process_group()
    gc.collect()  # garbage may hold a group's backend: the Trainer's cycles, collectives' Work objects
    dropped = _release_default_arguments() + _release_meshes()
    groups = {id(g): g for g in [world, *dropped] if g is not None}
    del world, dropped
    held = _held(groups)
    if held:
        print(
            f"[tandem] at exit: closed process group(s) {', '.join(held)} are still referenced by code outside "
            "Tandem; their gloo worker threads cannot be joined and may abort the interpreter's shutdown",
            file=sys.stderr,
        )
    return len(held)


def _held(groups: dict[int, Any]) -> list[str]:
    """The names of the gloo groups in `groups` that something beyond that dict still references."""
    return [
        str(getattr(groups[key], "group_name", key))
        for key in list(groups)
        if sys.getrefcount(groups[key]) > 2 and _is_gloo(groups[key])  # 2: the dict's and the argument's
    ]


def _is_gloo(group: Any) -> bool:
    try:
        return "gloo" in str(group.name()).lower()
    except Exception:  # a group whose backend is gone cannot tell: count it
        return True


# modules whose functions take `group=dist.group.WORLD` as a default argument, evaluated when first imported:
# imported after a group exists, they hold it (the pipeline's ShardedGradScaler is imported at setup)
_DEFAULTS_HOLDERS = ("torch.distributed.nn.functional", "torch.distributed.fsdp.sharded_grad_scaler")


def _release_default_arguments() -> list[Any]:
    """The groups that default arguments of torch's functions held (_DEFAULTS_HOLDERS), now set to None."""
    dist = sys.modules["torch.distributed"]
    released: list[Any] = []
    functions = []
    for name in _DEFAULTS_HOLDERS:
        module = sys.modules.get(name)
        for value in list(vars(module).values()) if module is not None else ():
            functions += list(vars(value).values()) if isinstance(value, type) else [value]
    for fn in functions:
        defaults = getattr(fn, "__defaults__", None)
        if isinstance(defaults, tuple) and any(issubclass(type(d), dist.ProcessGroup) for d in defaults):
            released += [d for d in defaults if issubclass(type(d), dist.ProcessGroup)]
            fn.__defaults__ = tuple(None if issubclass(type(d), dist.ProcessGroup) else d for d in defaults)
    return released


def _release_meshes() -> list[Any]:
    """The groups that live DeviceMeshes registered, their registries emptied (every group is closed)."""
    mesh_module = sys.modules.get("torch.distributed.device_mesh")
    mesh_class = getattr(mesh_module, "DeviceMesh", None)
    if mesh_class is None:
        return []
    released: list[Any] = []
    for obj in gc.get_objects():
        if issubclass(type(obj), mesh_class):
            registry = getattr(obj, "_pg_registry", None)
            if isinstance(registry, dict):
                released += registry.values()
                registry.clear()
    return released


def _at_exit() -> None:
    close_groups()


atexit.register(_at_exit)
