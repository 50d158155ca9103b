"""A stand-in communication device and a recorder of torch.distributed's collectives, for CPU tests of "every
tensor handed to a collective is on the strategy's communication device" (issue 41, finding 1).

On the CPU with gloo the communication device is the CPU, where every tensor already is: a check there cannot
fail. So the strategy's communication device is forced to a stand-in, "meta", that holds data: under
`StandInMode` every tensor made on (or moved to) "meta" is a `StandIn`, a tensor subclass that reports the
meta device and computes on a CPU tensor inside. The `Recorder` wraps torch.distributed's collectives: it
notes which call site passed which tensors on which device, unwraps StandIns so that gloo runs on their CPU
data in place, and collects every violation:

- a tensor Tandem (strategies/, trainer/, callbacks/) passes must be on the communication device, except the
  model's own gradient buckets (the Reducer's flat buffers), which live on the rank's device (the same device
  wherever NCCL runs) and are checked against it;
- a tensor torch or torchmetrics passes inside their own code (FSDP's all-gathers, the pipeline's sends, a
  Metric's state sync) holds model data: it must be on the rank's device;
- a gloo group Tandem made for host values (find_unused_parameters' agreement under NCCL) takes the CPU.
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map

STANDIN = torch.device("meta", 7)
_CPU = torch.device("cpu")
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_TANDEM = tuple(
    os.path.join(_ROOT, p) + os.sep for p in ("strategies", "trainer", "callbacks", "tandem_core")
)

# (point-to-point send/recv are left alone: torch's pipelining passes them by identity to P2POp, and only
# torch's pipeline stages use them, with the model's activations)
COLLECTIVES = (
    "all_reduce",
    "broadcast",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce",
    "gather",
    "scatter",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "monitored_barrier",
    "broadcast_object_list",
    "all_gather_object",
    "gather_object",
    "scatter_object_list",
)


class StandIn(torch.Tensor):
    """A tensor on the stand-in device: reports "meta", computes on the CPU tensor `data_` inside."""

    @staticmethod
    def __new__(cls, data: torch.Tensor) -> StandIn:
        t = torch.Tensor._make_wrapper_subclass(
            cls, data.shape, strides=data.stride(), dtype=data.dtype, device=STANDIN, requires_grad=False
        )
        t.data_ = data
        return t

    def __repr__(self) -> str:  # type: ignore[override]
        return f"StandIn({self.data_!r})"

    def __format__(self, spec: str) -> str:
        return self.data_.__format__(spec)

    def tolist(self) -> Any:  # type: ignore[override]
        return self.data_.tolist()

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        target = kwargs.get("device")
        leaves = (
            func in (torch.ops.aten._to_copy.default,) and target is not None and torch.device(target) == _CPU
        )
        args_, kwargs_ = tree_map(_unwrap, args), tree_map(_unwrap, kwargs)
        out = func(*args_, **kwargs_)
        if leaves or func is torch.ops.aten._local_scalar_dense.default:
            return out  # moved to the CPU, or a Python number: no longer on the stand-in

        def wrap(x: Any) -> Any:
            if isinstance(x, torch.Tensor) and not isinstance(x, StandIn):
                for a in args:  # an in-place op returns its input
                    if isinstance(a, StandIn) and a.data_ is x:
                        return a
                return StandIn(x)
            return x

        return tree_map(wrap, out)


def _unwrap(x: Any) -> Any:
    if isinstance(x, StandIn):
        return x.data_
    if isinstance(x, torch.device) and x == STANDIN:
        return _CPU
    return x


def _target(func: Any, args: tuple, kwargs: dict) -> torch.device | None:
    device = kwargs.get("device")
    if device is None and func is torch.Tensor.to:
        device = next((a for a in args[1:] if isinstance(a, (str, torch.device))), None)
    try:
        return None if device is None else torch.device(device)
    except (RuntimeError, TypeError):
        return None


class StandInMode(TorchFunctionMode):
    """Tensors made on, or moved to, the stand-in device become StandIns."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if _target(func, args, kwargs) != STANDIN:
            return func(*args, **kwargs)
        if func is torch.Tensor.to:
            source = args[0]
            if isinstance(source, StandIn):
                return func(*args, **kwargs)
            rest = [a for a in args[1:] if not isinstance(a, (str, torch.device))]
            options = {k: v for k, v in kwargs.items() if k not in ("device", "non_blocking", "copy")}
            return StandIn(source.to(*rest, **options).clone())
        return StandIn(func(*args, **dict(kwargs, device=_CPU)))


class Recorder:
    """Wraps torch.distributed's collectives (and the autograd-aware gather); `violations` and `sites`."""

    def __init__(self) -> None:
        self.trainer: Any = None  # the Trainer whose fit is running (its root device, its Reducer)
        self.label = ""  # the current run, in messages
        self.violations: list[str] = []
        self.sites: Counter[str] = Counter()  # "file:function" of Tandem's callers -> calls
        self._saved: list[tuple[Any, str, Any]] = []

    def install(self) -> None:
        import torch.distributed.nn.functional as dist_nn

        for name in COLLECTIVES:
            if hasattr(dist, name):
                self._patch(dist, name)
        self._patch(dist_nn, "all_gather")

    def uninstall(self) -> None:
        for module, name, fn in reversed(self._saved):
            setattr(module, name, fn)
        self._saved.clear()

    def _patch(self, module: Any, name: str) -> None:
        original = getattr(module, name)
        self._saved.append((module, name, original))

        def recorded(*args: Any, **kwargs: Any) -> Any:
            self._check(name, sys._getframe(1), args, kwargs)
            return original(*tree_map(_unwrap, args), **tree_map(_unwrap, kwargs))

        setattr(module, name, recorded)

    def _caller(self, frame: Any) -> tuple[str, str]:
        """("tandem" | "torch" | "torchmetrics" | "other", "file:function") of the frame calling the collective."""
        path = frame.f_code.co_filename
        where = f"{os.path.relpath(path, _ROOT) if path.startswith(_ROOT) else os.path.basename(path)}:{frame.f_code.co_name}"
        if path.startswith(_TANDEM):
            return "tandem", where
        if f"{os.sep}torchmetrics{os.sep}" in path:
            return "torchmetrics", where
        if f"{os.sep}torch{os.sep}" in path:
            return "torch", where
        return "other", where

    def _buckets(self) -> set[int]:
        """Storage addresses of the Reducer's gradient buckets (current and trial layouts)."""
        reducer = getattr(getattr(self.trainer, "strategy", None), "reducer", None)
        if reducer is None:
            return set()
        layouts = [reducer._layout, *(getattr(getattr(reducer, "_tuner", None), "trial", None) or [])]
        out = set()
        for layout in layouts:
            for b in layout.buckets:
                for t in (b.buf, b.comp):
                    if t is not None:
                        out.add(t.untyped_storage().data_ptr())
        return out

    def _host_group(self) -> Any:
        reducer = getattr(getattr(self.trainer, "strategy", None), "reducer", None)
        return getattr(getattr(reducer, "_used", None), "group", None)

    def _check(self, name: str, frame: Any, args: tuple, kwargs: dict) -> None:
        kind, where = self._caller(frame)
        if kind == "other":
            return  # the test's own collectives
        self.sites[f"{where} {name}"] += 1
        tensors: list[torch.Tensor] = []
        tree_map(lambda x: tensors.append(x) if isinstance(x, torch.Tensor) else None, (args, kwargs))
        if not tensors or self.trainer is None:
            return
        root = self.trainer.strategy.root_device
        group = kwargs.get("group")
        host_group = self._host_group()
        buckets = self._buckets() if kind == "tandem" else set()
        for t in tensors:
            if host_group is not None and group is host_group:
                expected, why = _CPU, "a gloo group for host values"
            elif kind != "tandem":  # model data where it lies, or what Tandem handed them on the stand-in
                expected, why = (t.device if t.device == STANDIN else root), f"model data passed by {kind}"
            elif not isinstance(t, StandIn) and t.untyped_storage().data_ptr() in buckets:
                expected, why = root, "a gradient bucket"
            else:
                expected, why = STANDIN, "the communication device"
            if t.device != expected:
                self.violations.append(
                    f"[{self.label}] {where} passed a {tuple(t.shape)} tensor on {t.device} to dist.{name}; "
                    f"expected {expected} ({why})"
                )


def force_comm_device(device: torch.device) -> Callable[[], None]:
    """Make every ProcessGroupStrategy communicate on `device` from the moment it joins its group; returns
    the undo."""
    from strategies.process_group import ProcessGroupStrategy

    original = ProcessGroupStrategy._join_group

    def join(self: Any) -> None:
        original(self)
        self.comm.device = device

    ProcessGroupStrategy._join_group = join  # type: ignore[method-assign]

    def undo() -> None:
        ProcessGroupStrategy._join_group = original  # type: ignore[method-assign]

    return undo
