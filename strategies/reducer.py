"""Bucketed-overlap gradient reducer on torch.distributed collectives (Li et al., VLDB 2020)."""

from __future__ import annotations

import functools
import itertools
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn

from strategies.autotune import AUTO_ITERATIONS, AUTO_MIN_GAIN, TRIAL_ITERATIONS, AutoTuner
from strategies.buckets import AutoBuckets, BucketLayout, BucketStats, assign_buckets
from tandem_core.errors import DistributedError

if TYPE_CHECKING:
    from strategies.fault_tolerance.averaging import CrossGroup

__all__ = [
    "AUTO_ITERATIONS",
    "AUTO_MIN_GAIN",
    "TRIAL_ITERATIONS",
    "AutoBuckets",
    "BucketStats",
    "Reducer",
    "assign_buckets",
]

_MB = 1024 * 1024
_COMPRESS = {"fp16": torch.float16, "bf16": torch.bfloat16}


def _broadcast(tensors: list[torch.Tensor], src: int, group: dist.ProcessGroup | None) -> None:
    """Broadcast tensors in place from `src`: one flat message per (device, dtype) instead of one each."""
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault((t.device, t.dtype), []).append(t.detach())
    with torch.no_grad():
        for chunk in groups.values():
            flat = torch.cat([t.reshape(-1) for t in chunk])
            dist.broadcast(flat, src=src, group=group)
            for t, part in zip(chunk, flat.split([t.numel() for t in chunk])):
                t.copy_(part.view_as(t))


class Reducer:
    """Averages gradients across ranks in buckets that are all-reduced while backward is still running.

    Example::

        reducer = Reducer(model, bucket_cap_mb=25)
        reducer.sync_buffers()
        loss = loss_fn(model(x), y)
        reducer.prepare_for_backward(loss)
        loss.backward()
        reducer.finalize()  # .grad now holds the average over ranks
        optimizer.step()
    """

    def __init__(
        self,
        module: nn.Module,
        process_group: dist.ProcessGroup | None = None,
        bucket_cap_mb: float | str = 25.0,
        first_bucket_cap_mb: float = 1.0,
        gradient_as_bucket_view: bool = True,
        find_unused_parameters: bool = False,
        comm_hook: str | None = None,
        broadcast_buffers: bool = True,
        rebuild_buckets: bool = True,
        static_graph: bool = False,
        cross_group: CrossGroup | None = None,
    ) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise DistributedError("Reducer needs a process group: call dist.init_process_group first")
        if comm_hook not in (None, *_COMPRESS):
            raise DistributedError(f"unknown comm_hook {comm_hook!r}: use None, 'fp16' or 'bf16'")
        # "auto": start with 25 MB buckets, measure, then try the cost model's choice (strategies/autotune.py)
        auto = bucket_cap_mb == "auto"
        if isinstance(bucket_cap_mb, str) and not auto:
            raise DistributedError(f"bucket_cap_mb must be a number of MB or 'auto', not {bucket_cap_mb!r}")
        bucket_cap_mb = 25.0 if auto else bucket_cap_mb
        if bucket_cap_mb <= 0 or first_bucket_cap_mb <= 0:
            raise DistributedError("bucket_cap_mb and first_bucket_cap_mb must be positive")
        self.module, self.process_group = module, process_group
        self.world_size = dist.get_world_size(process_group)
        self._src = 0 if process_group is None else dist.get_global_rank(process_group, 0)
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self.find_unused_parameters = find_unused_parameters
        self.broadcast_buffers = broadcast_buffers
        # static_graph: the same parameters are used every iteration, so the graph walk for unused ones
        # runs once and its answer is reused (it costs a traversal of the whole autograd graph per step)
        self.static_graph = static_graph
        self._static_unused: list[int] | None = None
        # fault tolerance (strategies/fault_tolerance/averaging.py): each bucket is averaged across the live
        # replica groups as well; it sets the divisor and launches the collectives
        self.cross_group = cross_group
        # named_parameters() drops repeats, so a tied weight is one parameter with one hook.
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        if not named:
            raise DistributedError("the module has no parameter with requires_grad=True: nothing to reduce")
        self.param_names = [n for n, _ in named]
        self.params = [p for _, p in named]
        self._check_same_params()
        _broadcast([*module.parameters(), *module.buffers()], self._src, process_group)

        n = len(self.params)
        self._lock = threading.Lock()  # hooks may run on several autograd device threads
        self._sync, self._armed, self._rebuilt = True, False, not (rebuild_buckets or auto)
        # backwards to finalize before the rebuild; "auto" measures a few of them first
        self._rebuild_after, self._iterations = (AUTO_ITERATIONS if auto else 1), 0
        tuned = auto and self.world_size > 1
        self._tuner = (
            AutoTuner(process_group, self._src, self.world_size, len(self.params)) if tuned else None
        )
        self._record: list[int] | None = None  # gradient-ready order, recorded until the rebuild
        self._ready, self._used = [False] * n, [0] * n
        self._used_t: torch.Tensor | None = None
        self._used_work: dist.Work | None = None
        self._next, self._t0 = 0, 0.0  # next bucket to launch; time origin of the stats
        cap = self.bucket_bytes_cap = int(bucket_cap_mb * _MB)  # (torch DDP's name, read under compile)
        first_cap = min(int(first_bucket_cap_mb * _MB), cap)  # a smaller bucket_cap_mb wins
        comp_dtype = _COMPRESS.get(comm_hook or "")
        self._layout = BucketLayout(
            self.params, self.param_names, first_cap, cap, comp_dtype, gradient_as_bucket_view
        )
        self._layout.build(list(reversed(range(n))))  # gradients arrive roughly in reverse order
        self.stats: list[BucketStats] = self._layout.new_stats()
        # When the last gradient hook of the last synchronised backward ran (seconds since
        # prepare_for_backward): the end of backward as far as gradients go; launches before it overlap.
        self.last_grad_s = 0.0
        self._handles = [
            p.register_post_accumulate_grad_hook(functools.partial(self._on_grad_ready, i))
            for i, p in enumerate(self.params)
        ]

    @property
    def auto(self) -> AutoBuckets | None:
        """What bucket_cap_mb="auto" measured and chose, once it has (None before, or without "auto")."""
        return self._tuner.result if self._tuner is not None else None

    @property
    def bucket_indices(self) -> list[list[int]]:
        """Parameter indices (into the trainable parameters) per bucket, in launch order."""
        return self._layout.indices

    def _check_same_params(self) -> None:
        """Raise on every rank if any rank's trainable parameters differ in name, shape or dtype."""
        mine = [(n, list(p.shape), str(p.dtype)) for n, p in zip(self.param_names, self.params)]
        everyone: list[list | None] = [None] * self.world_size
        dist.all_gather_object(everyone, mine, group=self.process_group)
        for rank, other in enumerate(everyone[1:], start=1):
            for a, b in itertools.zip_longest(everyone[0] or [], other or []):
                if a != b:
                    has = [
                        "no such parameter" if d is None else f"'{d[0]}' shape {d[1]} {d[2]}" for d in (a, b)
                    ]
                    raise DistributedError(
                        f"parameter '{(a or b)[0]}' differs across ranks: rank 0 has {has[0]}, rank {rank} has "
                        f"{has[1]}; build the same model (shapes, dtypes, requires_grad) on every rank"
                    )

    def prepare_for_backward(self, outputs: torch.Tensor | Sequence[torch.Tensor] | None = None) -> None:
        """Arm the hooks for the next backward; with find_unused_parameters, mark unreachable ones ready."""
        if not self._sync:
            return  # inside no_sync the next backward only accumulates locally
        if self._armed and (self._next or any(self._ready)):
            raise DistributedError(
                "a synchronised backward started before the previous one was finalized: call finalize() (the "
                "optimizer step) after every synchronised backward, or run extra passes inside no_sync()"
            )
        self._armed, self._next, self._used_work = True, 0, None
        self._ready = [False] * len(self.params)
        self._record = None if self._rebuilt else []
        self.stats, self.last_grad_s = self._layout.new_stats(), 0.0
        for b in self._layout.buckets:
            b.pending, b.work = len(b.params), None
        if not self.find_unused_parameters:
            unused = []
        elif self.static_graph and self._static_unused is not None:
            unused = self._static_unused
        else:
            unused = self._unreachable(outputs)
            if self.static_graph and outputs is not None:
                self._static_unused = unused
        if self.gradient_as_bucket_view:
            self._layout.attach_views()
        self._t0 = time.perf_counter()
        if self._tuner is not None:
            self._tuner.begin(self._t0, measuring=self._record is not None)
        for i in unused:
            self._mark_ready(i)

    def _unreachable(self, outputs: torch.Tensor | Sequence[torch.Tensor] | None) -> list[int]:
        """Indices of parameters that the autograd graph of `outputs` does not reach."""
        if isinstance(outputs, Mapping):
            outputs = list(outputs.values())
        roots = [outputs] if torch.is_tensor(outputs) else [t for t in outputs or () if torch.is_tensor(t)]
        roots = [t for t in roots if t.requires_grad]
        if not roots:
            return []  # unknown: parameters left without a gradient are marked ready in finalize
        reached = {id(t) for t in roots if t.grad_fn is None}
        stack, seen = [t.grad_fn for t in roots if t.grad_fn is not None], set()
        while stack:
            fn = stack.pop()
            if fn in seen:
                continue
            seen.add(fn)
            if (variable := getattr(fn, "variable", None)) is not None:  # AccumulateGrad: writes a leaf
                reached.add(id(variable))
            stack.extend(nxt for nxt, _ in fn.next_functions if nxt is not None)
        return [i for i, p in enumerate(self.params) if id(p) not in reached]

    def _on_grad_ready(self, i: int, param: torch.Tensor) -> None:
        """Post-accumulate-grad hook: stage the gradient and launch every bucket that is now complete."""
        self._used[i] = 1  # also inside no_sync: used once in an accumulation window counts as used
        if not self._armed:
            return
        with self._lock:
            if self._ready[i]:
                raise DistributedError(
                    f"parameter '{self.param_names[i]}' got a gradient twice in one synchronised backward, or "
                    "after it was marked unused: call prepare_for_backward(loss) with the tensor you call "
                    "backward on, once per synchronised backward, and run extra backward passes inside no_sync()"
                )
            self.last_grad_s = time.perf_counter() - self._t0
            if self._record is not None:
                self._record.append(i)
                if self._tuner is not None:
                    self._tuner.ready(i, self.last_grad_s)
            self._mark_ready(i)

    def _mark_ready(self, i: int) -> None:
        """Stage parameter i's gradient (zero if it has none) in its bucket; launch the buckets now complete."""
        self._ready[i] = True
        bucket = self._layout.stage(i)
        if bucket.pending == 0:
            self.stats[bucket.index].ready_s = time.perf_counter() - self._t0
            self._launch_ready()

    def _launch_ready(self) -> None:
        """Launch complete buckets strictly in index order, so every rank issues the same collectives."""
        buckets = self._layout.buckets
        while self._next < len(buckets) and buckets[self._next].pending == 0:
            b = buckets[self._next]
            self._next += 1
            self.stats[b.index].launch_s = time.perf_counter() - self._t0
            cross = self.cross_group
            # before compressing, so that fp16 sums cannot overflow
            b.buf.div_(self.world_size if cross is None else cross.divisor())
            if b.comp is not None:
                b.comp.copy_(b.buf)
            tensor = b.buf if b.comp is None else b.comp
            if cross is None:
                b.work = dist.all_reduce(tensor, group=self.process_group, async_op=True)
            else:
                b.work = cross.all_reduce(tensor)
        if self.find_unused_parameters and self._next == len(buckets) and self._used_work is None:
            # Whether any rank used a parameter decides if a None .grad stays None (torch DDP semantics).
            self._used_t = torch.tensor(self._used, dtype=torch.int32, device=buckets[0].buf.device)
            self._used_work = dist.all_reduce(self._used_t, group=self.process_group, async_op=True)

    def finalize(self) -> None:
        """Wait for every bucket and write the averaged gradients to .grad; call before optimizer.step()."""
        if not self._armed:
            return
        missing = [i for i, ready in enumerate(self._ready) if not ready]
        try:
            with self._lock:  # launch the rest even when about to raise, so no other rank is left hanging
                for i in missing:
                    self._mark_ready(i)
            for b in self._layout.buckets:
                start = time.perf_counter()
                b.work.wait()  # type: ignore[union-attr]
                stats = self.stats[b.index]
                stats.done_s = time.perf_counter() - self._t0
                stats.wait_s = stats.done_s - (start - self._t0)
                if b.comp is not None:
                    b.buf.copy_(b.comp)
            used = None
            if self._used_work is not None:
                self._used_work.wait()
                used = self._used_t.tolist()  # type: ignore[union-attr]
        finally:
            self._armed, self._used = False, [0] * len(self.params)
        if missing and not self.find_unused_parameters:
            names = ", ".join(f"'{self.param_names[i]}'" for i in missing[:10])
            more = f" and {len(missing) - 10} more" if len(missing) > 10 else ""
            raise DistributedError(
                f"parameters {names}{more} got no gradient in this backward: pass find_unused_parameters=True, "
                "use them in the loss, or set requires_grad=False on them"
            )
        self._layout.write_grads(used)
        self._iterations += 1
        if self._tuner is not None:
            self._layout = self._tuner.end(self._t0, self._layout)
        if not self._rebuilt and self._iterations >= self._rebuild_after:
            self._rebuild()

    def _rebuild(self) -> None:
        """Rebuild the buckets once, in rank 0's observed gradient-ready order, identically on every rank."""
        self._rebuilt = True
        record, self._record = self._record or [], None
        seen = set(record)
        order = record + [i for i in reversed(range(len(self.params))) if i not in seen]
        device = self._layout.buckets[0].buf.device
        if self._tuner is not None:
            self._layout = self._tuner.plan(order, self._layout, device)
            return
        order_t = torch.tensor(order, dtype=torch.int64, device=device)
        dist.broadcast(order_t, src=self._src, group=self.process_group)
        self._layout.build(order_t.tolist())

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Skip communication: backward passes inside only accumulate .grad locally."""
        previous, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = previous

    def sync_buffers(self) -> None:
        """Broadcast module buffers (e.g. BatchNorm running stats) from rank 0; call before forward."""
        buffers = list(self.module.buffers())
        if self.broadcast_buffers and buffers and self.world_size > 1:
            _broadcast(buffers, self._src, self.process_group)

    def remove_hooks(self) -> None:
        """Detach the reducer from the module's parameters."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
