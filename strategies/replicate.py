"""Replicating a task for DataParallel: copies whose tensors are differentiable functions of the task's own
(gradients sum back), plus merging what the replicas logged and their torchmetrics states."""

from __future__ import annotations

import copy
import inspect
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from strategies.batch import apply_to_tensors, is_metric
from strategies.coalesce import copies_on, sum_onto
from tandem_core.errors import TaskError

if TYPE_CHECKING:
    from trainer.task.base import Task


class Broadcast(torch.autograd.Function):
    """Copy tensors onto devices; backward sums the copies' gradients back onto the sources. Both in a few
    coalesced copies (strategies/coalesce.py), not one per tensor."""

    @staticmethod
    def forward(ctx: Any, devices: list[torch.device], *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.set_materialize_grads(False)  # a copy that takes no part in the loss sends None, not zeros
        ctx.like, ctx.source = tensors, tensors[0].device  # (their shapes and dtypes, for backward)
        return tuple(t for copies in copies_on(tensors, devices) for t in copies)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        n = len(ctx.like)
        per_replica = [grads[r * n : (r + 1) * n] for r in range(len(grads) // n)]
        return (None, *sum_onto(per_replica, ctx.like, ctx.source))


_OWN = ("_parameters", "_buffers", "_flat_weights")  # a module's own tensors, replicated above


def _needs_grad(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return any(isinstance(v, torch.Tensor) and v.requires_grad for v in value)
    if isinstance(value, dict):
        return any(isinstance(v, torch.Tensor) and v.requires_grad for v in value.values())
    return isinstance(value, torch.Tensor) and value.requires_grad


def _is_torchmetric(m: Any) -> bool:
    return is_metric(m) and hasattr(m, "merge_state")  # replicas' states are merged back


def _walk(module: torch.nn.Module, seen: set[int]) -> Iterator[torch.nn.Module]:
    """The modules under `module` once each; torchmetrics metrics are not entered (they are copied whole)."""
    if id(module) in seen:
        return
    seen.add(id(module))
    yield module
    if not _is_torchmetric(module):
        for child in module._modules.values():
            if child is not None:
                yield from _walk(child, seen)


class _Recorder:
    """Stands in for Task.log on a replica: keeps the calls, merged over replicas after the step. Each call is
    bound to `log`'s signature (the task's own), so positional options keep their meaning and a wrong
    keyword is the TypeError that self.log itself raises."""

    def __init__(self, log: Any) -> None:
        self.signature = inspect.signature(log)
        self.calls: list[tuple[str, Any, dict[str, Any]]] = []

    def __call__(self, name: str, value: Any, *args: Any, **kwargs: Any) -> None:
        options = self.signature.bind(name, value, *args, **kwargs).arguments
        del options["name"], options["value"]
        self.calls.append((name, value, options))


class Replicas:
    """The task on each device for one step. Replica 0 shares the task's parameters and buffers (so its
    BatchNorm statistics land in the task); the others get copies made by `Broadcast`."""

    def __init__(
        self,
        task: Task,
        devices: list[torch.device],
        grad: bool,
        metric_cache: dict[tuple[int, int], tuple[weakref.ref[Any], torch.nn.Module]],
    ) -> None:
        self.metrics: dict[int, tuple[Any, list[Any]]] = {}  # id(task's metric) -> (metric, replica copies)
        self.owner: dict[int, Any] = {}  # id(replica copy) -> the task's metric
        self._cache = metric_cache
        self.foreign = False  # a tensor that needs grad but is not a parameter or buffer of the task
        modules = list(_walk(task, set()))
        tensors: dict[int, torch.Tensor] = {}
        for m in modules:
            if not _is_torchmetric(m):
                for t in (*m._parameters.values(), *m._buffers.values()):
                    if t is not None:
                        tensors.setdefault(id(t), t)
        copies = _copytensors_in(list(tensors.values()), devices[1:], grad)
        tracked = [t for t in tensors.values() if grad and t.requires_grad]
        # the tensors each replica computes with that need grad (replica 0 uses the task's own)
        self.inputs = [tracked] + [[c[id(t)] for t in tracked] for c in copies]
        self.recorders = [_Recorder(task.log) for _ in devices]
        self.modules: list[Task] = []
        for r, device in enumerate(devices):
            replica = self._clone(task, None if r == 0 else copies[r - 1], device, r, {})
            replica.__dict__["log"] = self.recorders[r]  # an instance attribute shadows Task.log
            self.modules.append(replica)

    def _clone(
        self,
        m: Any,
        copies: dict[int, torch.Tensor] | None,
        device: torch.device,
        r: int,
        memo: dict[int, Any],
    ) -> Any:
        """A shallow copy of module `m` whose tensors are `copies` (or m's own when None)."""
        if id(m) in memo:
            return memo[id(m)]
        if _is_torchmetric(m):
            memo[id(m)] = clone = self._metric_copy(m, device, r)
            return clone
        clone = object.__new__(type(m))
        clone.__dict__.update(m.__dict__)
        # a tensor that needs grad held in a plain attribute (or a list or dict of them) is not in
        # self.inputs: backward must take the ordinary path to reach it
        self.foreign = self.foreign or any(_needs_grad(v) for k, v in m.__dict__.items() if k not in _OWN)
        memo[id(m)] = clone

        def pick(t: torch.Tensor | None) -> torch.Tensor | None:
            return t if t is None or copies is None else copies[id(t)]

        d = clone.__dict__
        d["_parameters"] = {k: pick(v) for k, v in m._parameters.items()}
        d["_buffers"] = {k: pick(v) for k, v in m._buffers.items()}
        d["_modules"] = {
            k: None if v is None else self._clone(v, copies, device, r, memo) for k, v in m._modules.items()
        }
        if "_flat_weights_names" in d:  # RNNs read their weights from this list, not from _parameters
            d["_flat_weights"] = [d["_parameters"].get(n) for n in d["_flat_weights_names"]]
        return clone

    def _metric_copy(self, metric: Any, device: torch.device, r: int) -> Any:
        """An empty copy of a torchmetrics metric for replica r (made once, reset every step)."""
        key = (id(metric), r)
        ref, clone = self._cache.get(key, (None, None))
        if ref is None or ref() is not metric:
            clone = copy.deepcopy(metric)  # deepcopy re-binds the metric's wrapped update/compute
            self._cache[key] = (weakref.ref(metric), clone)
        clone.reset()
        clone = clone.to(device)
        self.metrics.setdefault(id(metric), (metric, []))[1].append(clone)
        self.owner[id(clone)] = metric
        return clone

    def merge_metrics(self) -> None:
        """Add what each replica's metric copy saw to the task's metric."""
        for metric, clones in self.metrics.values():
            used = [c for c in clones if getattr(c, "_update_count", 0) > 0]
            for c in used:
                _merge_state(metric, c.to(metric.device))
            if used:
                metric._update_count += max(c._update_count for c in used)
                metric._computed = None

    def _batch_value(self, metric: Any) -> None:
        """Set the metric's batch value (what self.log reads) to its value on the whole batch."""
        used = [c for c in self.metrics[id(metric)][1] if getattr(c, "_update_count", 0) > 0]
        if not used or all(c._forward_cache is None for c in used):
            return
        whole = used[0]  # already merged into the task's metric: free to absorb the others
        for c in used[1:]:
            _merge_state(whole, c)
        whole._computed = None
        metric._forward_cache = whole.compute()

    def replay_logs(self, task: Task, sizes: list[int], device: torch.device) -> None:
        """Log once on the task what the replicas logged: the j-th call of a name on every replica merged."""
        groups: dict[tuple[str, int], list[tuple[int, Any, dict[str, Any]]]] = {}
        for r, rec in enumerate(self.recorders):
            seen: dict[str, int] = {}
            for name, value, kwargs in rec.calls:
                seen[name] = seen.get(name, -1) + 1
                groups.setdefault((name, seen[name]), []).append((r, value, kwargs))
        done: set[int] = set()
        for (name, _), calls in groups.items():
            value, kwargs = self._merge(name, calls, sizes, device, done)
            task.log(name, value, **kwargs)

    def _merge(
        self,
        name: str,
        calls: list[tuple[int, Any, dict[str, Any]]],
        sizes: list[int],
        device: torch.device,
        done: set[int],
    ) -> tuple[Any, dict[str, Any]]:
        kwargs = dict(calls[0][2])
        values = [v for _, v, _ in calls]
        if hasattr(values[0], "compute") and hasattr(values[0], "update"):  # a torchmetrics Metric
            metric = self.owner.get(id(values[0]))
            if metric is None:
                raise TaskError(
                    f"self.log({name!r}) got a metric that is not a submodule of the task; under strategy='dp' "
                    "metrics must be attributes of the task (or in a ModuleDict/ModuleList) to be replicated."
                )
            if id(metric) not in done:
                self._batch_value(metric)
                done.add(id(metric))
            return metric, kwargs
        if not all(
            isinstance(v, (int, float, bool)) or (isinstance(v, torch.Tensor) and v.numel() == 1)
            for v in values
        ):
            return values[0], kwargs  # not a scalar: the metric store raises its own error
        ts = [torch.as_tensor(v).detach().to(device).reshape(()) for v in values]
        fx = kwargs.get("reduce_fx", "mean")
        fx = fx if isinstance(fx, str) else getattr(fx, "__name__", str(fx))
        if fx == "mean":
            weights = [kw.get("batch_size") or sizes[r] for r, _, kw in calls]
            dtype = torch.float64 if any(t.dtype == torch.float64 for t in ts) else torch.float32
            total = float(sum(weights))
            value = torch.stack([t.to(dtype) * (w / total) for t, w in zip(ts, weights)]).sum()
            if any(kw.get("batch_size") for _, _, kw in calls):
                kwargs["batch_size"] = int(sum(weights))
            return value, kwargs
        stacked = torch.stack([t.to(ts[0].dtype) for t in ts])
        merged = {"sum": stacked.sum, "max": stacked.amax, "min": stacked.amin}.get(fx)
        return (merged() if merged is not None else values[0]), kwargs


def _merge_state(metric: Any, incoming: Any) -> None:
    try:
        metric.merge_state(incoming)
    except RuntimeError:  # full_state_update metrics refuse, but their states still reduce by dist_reduce_fx
        metric._reduce_states(incoming.metric_state)


def tensors_in(data: Any) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    apply_to_tensors(data, found.append)
    return found


def _copytensors_in(
    tensors: list[torch.Tensor], devices: list[torch.device], grad: bool
) -> list[dict[int, torch.Tensor]]:
    """For each device, id(tensor) -> its copy there; copies of tensors that need grad stay on the graph."""
    copies: list[dict[int, torch.Tensor]] = [{} for _ in devices]
    if not devices:
        return copies
    tracked = [t for t in tensors if grad and t.requires_grad]
    if tracked:
        out = Broadcast.apply(devices, *tracked)
        for r in range(len(devices)):
            for i, t in enumerate(tracked):
                copies[r][id(t)] = out[r * len(tracked) + i]
    untracked = [t for t in tensors if not (grad and t.requires_grad)]
    for r, made in enumerate(copies_on(untracked, devices)):
        for t, c in zip(untracked, made):
            copies[r][id(t)] = c
    return copies
