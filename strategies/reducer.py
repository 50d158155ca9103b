"""Bucketed-overlap gradient reducer on torch.distributed collectives (Li et al., VLDB 2020)."""

from __future__ import annotations

import functools
import itertools
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from strategies.autotune import AUTO_ITERATIONS, AUTO_MIN_GAIN, TRIAL_ITERATIONS, AutoTuner
from strategies.buckets import AutoBuckets, BucketLayout, BucketStats, assign_buckets
from strategies.comm_device import broadcast_tensors, comm_device
from strategies.timing import HostTimer, timer_for
from strategies.unused import UsedParameters
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
        device: torch.device | None = None,
        record_stats: bool | None = None,
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
        # where the tensors it hands to collectives are made (strategies/comm_device.py): the strategy's
        # communication device, else the one the group's backend takes
        self.device = device if device is not None else comm_device(process_group, self.params[0].device)
        self._check_same_params()
        broadcast_tensors([*module.parameters(), *module.buffers()], self._src, process_group, self.device)

        n = len(self.params)
        self._lock = threading.Lock()  # hooks may run on several autograd device threads
        self._sync, self._armed, self._rebuilt = True, False, not (rebuild_buckets or auto)
        # backwards to finalize before the rebuild; "auto" measures a few of them first
        self._rebuild_after, self._iterations = (AUTO_ITERATIONS if auto else 1), 0
        tuned = auto and self.world_size > 1
        # times on the device's own clock (CUDA events on a GPU: strategies/timing.py); with record_stats
        # (default: on the CPU, where the clock costs nothing) every backward's bucket statistics, else only
        # what the autotuner measures
        self._timer = timer_for(self.params[0].device)
        self.record_stats = isinstance(self._timer, HostTimer) if record_stats is None else record_stats
        self._tuner = (
            AutoTuner(process_group, self._src, self.world_size, n, self.device, self._timer)
            if tuned
            else None
        )
        self._record: list[int] | None = None  # gradient-ready order, recorded until the rebuild
        self._ready = [False] * n
        self._used = UsedParameters(n, process_group, self.device) if find_unused_parameters else None
        self._next, self._t0 = 0, self._timer.mark()  # next bucket to launch; time origin of the stats
        self._timed = self.record_stats  # this backward's statistics are recorded
        self._marks: list[tuple[int, str, Any]] = []  # (bucket, BucketStats field, mark), read lazily
        self._last: Any = None  # mark of the last gradient of the last synchronised backward
        cap = self.bucket_bytes_cap = int(bucket_cap_mb * _MB)  # (torch DDP's name, read under compile)
        first_cap = min(int(first_bucket_cap_mb * _MB), cap)  # a smaller bucket_cap_mb wins
        comp_dtype = _COMPRESS.get(comm_hook or "")
        self._layout = BucketLayout(
            self.params, self.param_names, first_cap, cap, comp_dtype, gradient_as_bucket_view
        )
        self._layout.build(list(reversed(range(n))))  # gradients arrive roughly in reverse order
        self._stats: list[BucketStats] = self._layout.new_stats()
        self._handles = [
            p.register_post_accumulate_grad_hook(functools.partial(self._on_grad_ready, i))
            for i, p in enumerate(self.params)
        ]

    @property
    def auto(self) -> AutoBuckets | None:
        """What bucket_cap_mb="auto" measured and chose, once it has (None before, or without "auto")."""
        return self._tuner.result if self._tuner is not None else None

    @property
    def stats(self) -> list[BucketStats]:
        """Per bucket, the last synchronised backward's bytes and times (seconds since prepare_for_backward, on
        the device's clock: reading them waits for that backward's work on a GPU; zeros without record_stats)."""
        if self._marks:
            marks, self._marks = self._marks, []
            for i, field, mark in marks:
                setattr(self._stats[i], field, self._timer.seconds(self._t0, mark))
        return self._stats

    @property
    def last_grad_s(self) -> float:
        """When the last gradient of the last synchronised backward was ready (seconds since
        prepare_for_backward): the end of backward as far as gradients go; launches before it overlap."""
        return 0.0 if self._last is None else self._timer.seconds(self._t0, self._last)

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
        self._armed, self._next = True, 0
        self._ready = [False] * len(self.params)
        self._record = None if self._rebuilt else []
        self._timed = self.record_stats or (self._tuner is not None and self._tuner.timing)
        self._stats, self._marks, self._last = self._layout.new_stats(), [], None
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
        if self._timed:
            self._t0 = self._timer.mark()
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
        if self._used is not None:  # also inside no_sync: used once in an accumulation window counts as used
            self._used.local[i] = 1
        if not self._armed:
            return
        with self._lock:
            if self._ready[i]:
                raise DistributedError(
                    f"parameter '{self.param_names[i]}' got a gradient twice in one synchronised backward, or "
                    "after it was marked unused: call prepare_for_backward(loss) with the tensor you call "
                    "backward on, once per synchronised backward, and run extra backward passes inside no_sync()"
                )
            if self._record is not None:
                self._record.append(i)
                if self._tuner is not None:
                    self._tuner.ready(i, self._timer.mark())
            self._mark_ready(i)

    def _mark_ready(self, i: int) -> None:
        """Stage parameter i's gradient (zero if it has none) in its bucket; launch the buckets now complete."""
        self._ready[i] = True
        bucket = self._layout.stage(i)
        if bucket.pending == 0:
            if self._timed:  # the last gradient completes a bucket: the last such mark is the last gradient's
                self._last = self._timer.mark()
                self._marks.append((bucket.index, "ready_s", self._last))
            self._launch_ready()

    def _launch_ready(self) -> None:
        """Launch complete buckets strictly in index order, so every rank issues the same collectives."""
        buckets = self._layout.buckets
        while self._next < len(buckets) and buckets[self._next].pending == 0:
            b = buckets[self._next]
            self._next += 1
            if self._timed:
                self._marks.append((b.index, "launch_s", self._timer.mark()))
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
        if self._used is not None and self._next == len(buckets) and not self._used.started:
            self._used.start()  # whether any rank used a parameter: a None .grad stays None if none did

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
                b.work.wait()  # type: ignore[union-attr]  # (NCCL: the stream waits, not the host)
                if self._timed:
                    self._stats[b.index].wait_s = time.perf_counter() - start  # the host's own wait
                    self._marks.append((b.index, "done_s", self._timer.mark()))
                if b.comp is not None:
                    b.buf.copy_(b.comp)
            used = self._used.collect() if self._used is not None else None  # host values, agreed on the host
        except BaseException:
            if self._used is not None:
                self._used.reset()
            raise
        finally:
            self._armed = False
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
            self._layout = self._tuner.end(
                self._t0, self._layout, self._timer.mark() if self._timed else None
            )
        if not self._rebuilt and self._iterations >= self._rebuild_after:
            self._rebuild()

    def _rebuild(self) -> None:
        """Rebuild the buckets once, in rank 0's observed gradient-ready order, identically on every rank."""
        self._rebuilt = True
        record, self._record = self._record or [], None
        seen = set(record)
        order = record + [i for i in reversed(range(len(self.params))) if i not in seen]
        if self._tuner is not None:
            self._layout = self._tuner.plan(order, self._layout)
            return
        # (a list, not a tensor read back on the host: the memory plan rehearses this on fake tensors)
        box = [order]
        dist.broadcast_object_list(box, src=self._src, group=self.process_group, device=self.device)
        self._layout.build(box[0])

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
            broadcast_tensors(buffers, self._src, self.process_group, self.device)

    def remove_hooks(self) -> None:
        """Detach the reducer from the module's parameters."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
