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
  optimizer imports it through torch._dynamo), they hold it; so does ZeroRedundancyOptimizer's module
  (strategy='ddp_zero1'). Such defaults, in any torch.distributed module, become None (the default group,
  which is what the functions document).
- Objects Tandem made that hold a group (the ZeRO optimizers of ddp_zero1, find_unused_parameters' gloo
  group under NCCL) register a release with `on_close`: called first.
- A DeviceMesh (FSDP's) keeps its groups in `_pg_registry` (for torch.compile tracing), and the mesh itself
  outlives the model in torch's DTensor caches (the sharding propagator's, per thread); FSDP's FSDPMeshInfo
  caches its group as an attribute and lives as long as the model (a script's global at exit). After
  `destroy_process_group` every group is closed, so those registries are emptied and such attributes of
  torch.distributed's objects set to None.

The handler is registered when `strategies` is imported (importing Trainer does it), before a script's own
`atexit.register(dist.destroy_process_group)`: atexit runs last-in first-out, so the script's handler runs
first and this one then finds the group closed and only drops the references. It acts only in a process
where a fit joined a group (`joined`): a single-device run pays nothing at exit.
"""

from __future__ import annotations

import atexit
import gc
import sys
import types
import weakref
from collections.abc import Callable
from typing import Any

_joined = False  # a fit joined a process group in this process (ours, torchrun's or the user's)
# what Tandem's objects registered to drop their references to a group before it closes (weakly held)
_releases: list[weakref.ref[Any]] = []


def on_close(release: Callable[[], None]) -> None:
    """Call `release` (a bound method, held weakly: it does not keep its object alive) at exit, before the
    groups close: it drops the references to a process group that an object Tandem made holds (a
    ZeroRedundancyOptimizer's, a gloo side group), so that the closed group is freed while the interpreter
    is whole."""
    _releases[:] = [r for r in _releases if r() is not None]
    _releases.append(weakref.WeakMethod(release) if hasattr(release, "__self__") else weakref.ref(release))


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
    for ref in _releases:
        release = ref()
        if release is not None:
            release()
    _releases.clear()
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


def _release_default_arguments() -> list[Any]:
    """The groups that the default arguments of torch.distributed's functions and methods held, now set to None
    (the default group, which is what those functions document): torch.distributed.nn.functional's,
    ZeroRedundancyOptimizer's `_broadcast_object` (imported when strategy='ddp_zero1' builds its first twin),
    ShardedGradScaler's methods (imported at the pipeline's setup)."""
    dist = sys.modules["torch.distributed"]
    released: list[Any] = []
    functions: list[Any] = []
    modules = [m for name, m in list(sys.modules.items()) if name.startswith("torch.distributed.") and m]
    for module in modules:
        for value in list(vars(module).values()):
            # (type(), not isinstance: an object such as torch.distributed.reduce_op warns on every
            # attribute read, __class__ included)
            functions += list(vars(value).values()) if issubclass(type(value), type) else [value]
    for fn in functions:
        defaults = fn.__defaults__ if type(fn) is types.FunctionType else None
        if isinstance(defaults, tuple) and any(issubclass(type(d), dist.ProcessGroup) for d in defaults):
            released += [d for d in defaults if issubclass(type(d), dist.ProcessGroup)]
            fn.__defaults__ = tuple(None if issubclass(type(d), dist.ProcessGroup) else d for d in defaults)
    return released


def _release_meshes() -> list[Any]:
    """The groups that live torch.distributed objects hold, dropped (every group is closed): a DeviceMesh's
    `_pg_registry` emptied, and an attribute holding a group (FSDP's FSDPMeshInfo caches its mesh's group as
    `shard_process_group`; it lives as long as the model, e.g. a script's global) set to None."""
    dist = sys.modules["torch.distributed"]
    mesh_module = sys.modules.get("torch.distributed.device_mesh")
    mesh_class = getattr(mesh_module, "DeviceMesh", None)
    released: list[Any] = []
    for obj in gc.get_objects():
        cls = type(obj)
        module = getattr(cls, "__module__", None)  # (a str, except for type itself)
        if not (isinstance(module, str) and module.startswith("torch.distributed")):
            continue
        if mesh_class is not None and issubclass(cls, mesh_class):
            registry = getattr(obj, "_pg_registry", None)
            if isinstance(registry, dict):
                released += registry.values()
                registry.clear()
        try:  # (past any __getattribute__ of the class: torch.distributed.reduce_op's warns)
            attrs = object.__getattribute__(obj, "__dict__")
        except AttributeError:
            continue
        if not isinstance(attrs, dict):
            continue
        for name, value in list(attrs.items()):
            if issubclass(type(value), dist.ProcessGroup):
                released.append(value)
                attrs[name] = None
    return released


def _at_exit() -> None:
    close_groups()


atexit.register(_at_exit)
