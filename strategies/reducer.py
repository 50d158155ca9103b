"""Bucketed-overlap gradient reducer on torch.distributed collectives (Li et al., VLDB 2020)."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from trainer.errors import DistributedError

_MB = 1024 * 1024
_BROADCAST_CHUNK = 256 * _MB  # bounds the temporary copy made when broadcasting the model
_COMPRESS = {"fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass
class BucketStats:
    """One bucket of the last synchronised backward; times are seconds since prepare_for_backward."""

    index: int
    numel: int
    nbytes: int
    dtype: torch.dtype
    device: torch.device
    param_names: list[str]
    ready_s: float = 0.0  # its last gradient became ready
    launch_s: float = 0.0  # its all_reduce was launched
    wait_s: float = 0.0  # time blocked in wait() inside finalize: communication not hidden by backward
    done_s: float = 0.0  # wait() returned (an upper bound on when the all_reduce finished)


class _Bucket:
    """One flat gradient buffer, the parameters laid out in it and its in-flight work."""

    __slots__ = ("index", "params", "buf", "comp", "pending", "work")

    def __init__(self, index: int, params: list[int], buf: torch.Tensor, comp: torch.Tensor | None) -> None:
        self.index, self.params, self.buf, self.comp = index, params, buf, comp
        self.pending = len(params)
        self.work: dist.Work | None = None


def assign_buckets(
    sizes: list[int], keys: list[object], order: list[int], first_cap: int, cap: int
) -> list[list[int]]:
    """Group parameter indices (visited in `order`) into buckets per key, first bucket of a key <= first_cap."""
    open_: dict[object, list[int]] = {}
    filled: dict[object, int] = {}
    limit: dict[object, int] = {}
    done: list[list[int]] = []
    for i in order:
        key = keys[i]
        current = open_.setdefault(key, [])
        # Close before overflowing, so a bucket exceeds its cap only when one parameter alone does.
        if current and filled[key] + sizes[i] > limit.get(key, first_cap):
            done.append(current)
            current = open_[key] = []
            limit[key] = cap
        if not current:
            filled[key] = 0
        current.append(i)
        filled[key] += sizes[i]
    done.extend(b for b in open_.values() if b)
    # Buckets launch in the order their first gradient is expected, whatever their dtype or device.
    position = {i: k for k, i in enumerate(order)}
    return sorted(done, key=lambda bucket: position[bucket[0]])


def _broadcast(tensors: list[torch.Tensor], src: int, group: dist.ProcessGroup | None) -> None:
    """Broadcast tensors in place from `src`, coalesced into a few flat messages per (device, dtype)."""
    groups: dict[tuple[torch.device, torch.dtype], list[list[torch.Tensor]]] = {}
    for t in tensors:
        chunks = groups.setdefault((t.device, t.dtype), [[]])
        if chunks[-1] and sum(c.numel() * c.element_size() for c in chunks[-1]) > _BROADCAST_CHUNK:
            chunks.append([])
        chunks[-1].append(t.detach())
    with torch.no_grad():
        for chunk in (c for chunks in groups.values() for c in chunks):
            flat = torch.cat([t.reshape(-1) for t in chunk])
            dist.broadcast(flat, src=src, group=group)
            for t, part in zip(chunk, flat.split([t.numel() for t in chunk])):
                t.copy_(part.view_as(t))


class Reducer:
    """Averages gradients across ranks in buckets launched while backward is still running.

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
        bucket_cap_mb: float = 25.0,
        first_bucket_cap_mb: float = 1.0,
        gradient_as_bucket_view: bool = True,
        find_unused_parameters: bool = False,
        comm_hook: str | None = None,
        broadcast_buffers: bool = True,
        rebuild_buckets: bool = True,
    ) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise DistributedError(
                "Reducer needs an initialised process group: call init_process_group first"
            )
        if comm_hook not in (None, *_COMPRESS):
            raise DistributedError(f"unknown comm_hook {comm_hook!r}: use None, 'fp16' or 'bf16'")
        if bucket_cap_mb <= 0 or first_bucket_cap_mb <= 0:
            raise DistributedError("bucket_cap_mb and first_bucket_cap_mb must be positive")
        self.module = module
        self.process_group = process_group
        self.world_size = dist.get_world_size(process_group)
        self._src = 0 if process_group is None else dist.get_global_rank(process_group, 0)
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self.find_unused_parameters = find_unused_parameters
        self.broadcast_buffers = broadcast_buffers
        self._cap = int(bucket_cap_mb * _MB)
        self._first_cap = min(int(first_bucket_cap_mb * _MB), self._cap)  # a smaller cap wins
        self._comp_dtype = _COMPRESS.get(comm_hook) if comm_hook else None
        # named_parameters() already drops repeats, so tied weights appear (and are reduced) once.
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        if not named:
            raise DistributedError("the module has no parameters with requires_grad=True; nothing to reduce")
        self.param_names = [n for n, _ in named]
        self.params = [p for _, p in named]
        self._check_same_params()
        _broadcast([*module.parameters(), *module.buffers()], self._src, process_group)

        self._lock = threading.Lock()  # hooks may run on several autograd device threads
        self._sync = True
        self._armed = False
        self._rebuilt = not rebuild_buckets
        self._record: list[int] | None = None
        self._ready = [False] * len(self.params)
        self._used = [0] * len(self.params)
        self._used_t: torch.Tensor | None = None
        self._used_work: dist.Work | None = None
        self._next = 0
        self._t0 = time.perf_counter()
        self._buckets: list[_Bucket] = []
        self._bucket_of: list[_Bucket] = []
        self._views: list[torch.Tensor] = []
        self._fresh: list[bool] = []
        self._build_buckets(list(reversed(range(len(self.params)))))
        self.stats: list[BucketStats] = [self._new_stats(b) for b in self._buckets]
        self._handles = [
            p.register_post_accumulate_grad_hook(functools.partial(self._on_grad_ready, i))
            for i, p in enumerate(self.params)
        ]

    @property
    def bucket_indices(self) -> list[list[int]]:
        """Parameter indices (into the trainable parameters) per bucket, in launch order."""
        return [list(b.params) for b in self._buckets]

    def _check_same_params(self) -> None:
        """Raise on every rank if any rank's trainable parameters differ in name, shape or dtype."""
        mine = [
            (n, tuple(p.shape), str(p.dtype).replace("torch.", ""))
            for n, p in zip(self.param_names, self.params)
        ]
        everyone: list[list[tuple[str, tuple[int, ...], str]] | None] = [None] * self.world_size
        dist.all_gather_object(everyone, mine, group=self.process_group)
        ref = everyone[0] or []
        for rank, other in enumerate(everyone[1:], start=1):
            other = other or []
            for k in range(max(len(ref), len(other))):
                a = ref[k] if k < len(ref) else None
                b = other[k] if k < len(other) else None
                if a != b:
                    name = (a or b)[0]  # type: ignore[index]

                    def show(d: tuple[str, tuple[int, ...], str] | None) -> str:
                        return "no such parameter" if d is None else f"'{d[0]}' shape {list(d[1])} {d[2]}"

                    raise DistributedError(
                        f"parameter '{name}' differs across ranks: rank 0 has {show(a)}, rank {rank} has {show(b)}; "
                        "build the same model (shapes, dtypes, requires_grad) on every rank before wrapping it"
                    )

    def _build_buckets(self, order: list[int]) -> None:
        """Lay parameters out in flat buffers following `order`, keeping any existing .grad values."""
        sizes = [p.numel() * p.element_size() for p in self.params]
        keys: list[object] = [(p.device, p.dtype) for p in self.params]
        assignment = assign_buckets(sizes, keys, order, self._first_cap, self._cap)
        if assignment == self.bucket_indices:
            return
        buckets: list[_Bucket] = []
        views: list[torch.Tensor | None] = [None] * len(self.params)
        bucket_of: list[_Bucket | None] = [None] * len(self.params)
        for index, members in enumerate(assignment):
            first = self.params[members[0]]
            buf = torch.zeros(
                sum(self.params[i].numel() for i in members), dtype=first.dtype, device=first.device
            )
            compress = (
                self._comp_dtype is not None and first.dtype.is_floating_point and first.element_size() > 2
            )
            comp = torch.empty_like(buf, dtype=self._comp_dtype) if compress else None
            bucket = _Bucket(index, members, buf, comp)
            offset = 0
            for i in members:
                p = self.params[i]
                views[i] = buf[offset : offset + p.numel()].view_as(p)
                bucket_of[i] = bucket
                offset += p.numel()
            buckets.append(bucket)
        with torch.no_grad():  # existing gradients (e.g. from the first iteration) move into the new buffers
            for p, view in zip(self.params, views):
                if p.grad is not None:
                    view.copy_(p.grad)  # type: ignore[union-attr]
                    if self.gradient_as_bucket_view:
                        p.grad = view
        self._buckets, self._views, self._bucket_of = buckets, views, bucket_of  # type: ignore[assignment]

    def _new_stats(self, b: _Bucket) -> BucketStats:
        """Empty statistics for bucket `b`."""
        names = [self.param_names[i] for i in b.params]
        nbytes = b.buf.numel() * b.buf.element_size()
        return BucketStats(b.index, b.buf.numel(), nbytes, b.buf.dtype, b.buf.device, names)

    def prepare_for_backward(self, outputs: torch.Tensor | Sequence[torch.Tensor] | None = None) -> None:
        """Arm the hooks for the next backward; with find_unused_parameters, mark unreachable parameters ready."""
        if not self._sync:
            return  # inside no_sync the next backward only accumulates locally
        if self._armed and (self._next or any(self._ready)):
            raise DistributedError(
                "a synchronised backward started before the previous one was finalized; "
                "call finalize() (the optimizer step) after every backward, or run extra passes inside no_sync()"
            )
        self._armed = True
        self._next = 0
        self._ready = [False] * len(self.params)
        self._used_work = None
        self._record = None if self._rebuilt else []
        self.stats = [self._new_stats(b) for b in self._buckets]
        for b in self._buckets:
            b.pending, b.work = len(b.params), None
        unused = self._unreachable(outputs) if self.find_unused_parameters else []
        if self.gradient_as_bucket_view:
            self._attach_views()
        self._t0 = time.perf_counter()
        for i in unused:
            self._mark_unused_ready(i)

    def _attach_views(self) -> None:
        """Point every .grad at its bucket slot so AccumulateGrad adds in place (zero_grad may have set None)."""
        # Remember which grads were None: a parameter no rank uses gets None back, as with torch DDP.
        self._fresh = [p.grad is None for p in self.params]
        with torch.no_grad():
            for b in self._buckets:
                whole = all(self._fresh[i] for i in b.params)
                if whole:
                    b.buf.zero_()  # one fill per bucket instead of one per parameter
                for i in b.params:
                    p, view = self.params[i], self._views[i]
                    if p.grad is None:
                        if not whole:
                            view.zero_()
                        p.grad = view
                    elif p.grad is not view:
                        view.copy_(p.grad)
                        p.grad = view

    def _unreachable(self, outputs: torch.Tensor | Sequence[torch.Tensor] | None) -> list[int]:
        """Indices of parameters that the autograd graph of `outputs` does not reach."""
        if outputs is None:
            return []  # unknown: any parameter left without a gradient is marked ready in finalize
        roots = (
            [outputs]
            if isinstance(outputs, torch.Tensor)
            else [t for t in outputs if isinstance(t, torch.Tensor)]
        )
        reached = {id(t) for t in roots if t.grad_fn is None and t.requires_grad}
        stack = [t.grad_fn for t in roots if t.grad_fn is not None]
        seen = set()
        while stack:
            fn = stack.pop()
            if fn in seen:
                continue
            seen.add(fn)
            variable = getattr(fn, "variable", None)  # AccumulateGrad nodes hold the leaf they write to
            if variable is not None:
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
                    f"parameter '{self.param_names[i]}' got its gradient twice in one synchronised backward, or "
                    "after being marked unused: call prepare_for_backward(loss) with the tensor you call "
                    "backward on, once per synchronised backward, and run extra backward passes inside no_sync()"
                )
            self._ready[i] = True
            if self._record is not None:
                self._record.append(i)
            view = self._views[i]
            if param.grad is not view:  # copy mode, or AccumulateGrad replaced the view with a new tensor
                view.copy_(param.grad)
                if self.gradient_as_bucket_view:
                    param.grad = view
            bucket = self._bucket_of[i]
            bucket.pending -= 1
            if bucket.pending == 0:
                self.stats[bucket.index].ready_s = time.perf_counter() - self._t0
                self._launch_ready()

    def _mark_unused_ready(self, i: int) -> None:
        """Count parameter i as ready with its current local gradient (zero if none) as its contribution."""
        grad = self.params[i].grad
        view = self._views[i]
        if grad is None:
            view.zero_()
        elif grad is not view:
            view.copy_(grad)
        self._ready[i] = True
        bucket = self._bucket_of[i]
        bucket.pending -= 1
        if bucket.pending == 0:
            self.stats[bucket.index].ready_s = time.perf_counter() - self._t0
            self._launch_ready()

    def _launch_ready(self) -> None:
        """Launch complete buckets strictly in index order, so every rank issues the same collectives."""
        buckets = self._buckets
        while self._next < len(buckets) and buckets[self._next].pending == 0:
            b = buckets[self._next]
            self._next += 1
            self.stats[b.index].launch_s = time.perf_counter() - self._t0
            b.buf.div_(self.world_size)  # before compression, so fp16 sums cannot overflow
            if b.comp is not None:
                b.comp.copy_(b.buf)
            b.work = dist.all_reduce(
                b.buf if b.comp is None else b.comp, group=self.process_group, async_op=True
            )
        if self.find_unused_parameters and self._next == len(buckets) and self._used_work is None:
            # Which parameters some rank used decides whether a None grad stays None (torch DDP semantics).
            self._used_t = torch.tensor(self._used, dtype=torch.int32, device=buckets[0].buf.device)
            self._used_work = dist.all_reduce(self._used_t, group=self.process_group, async_op=True)

    def finalize(self) -> None:
        """Wait for all buckets and write the averaged gradients to .grad; call before optimizer.step()."""
        if not self._armed:
            return
        missing = [i for i, ready in enumerate(self._ready) if not ready]
        try:
            with self._lock:
                # Launch whatever is left even when about to raise, so the other ranks are not left hanging.
                for i in missing:
                    self._mark_unused_ready(i)
            for b in self._buckets:
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
            self._armed = False
            self._used = [0] * len(self.params)
        if missing and not self.find_unused_parameters:
            names = ", ".join(f"'{self.param_names[i]}'" for i in missing[:10])
            more = f" and {len(missing) - 10} more" if len(missing) > 10 else ""
            raise DistributedError(
                f"parameters {names}{more} received no gradient in this backward: pass "
                "find_unused_parameters=True, use them in the loss, or set requires_grad=False on them"
            )
        self._write_grads(used)
        if not self._rebuilt:
            self._rebuild()

    def _write_grads(self, used: list[int] | None) -> None:
        """Expose the averaged buckets as .grad, keeping None for parameters that no rank used."""
        with torch.no_grad():
            for i, p in enumerate(self.params):
                view = self._views[i]
                if (
                    used is not None
                    and not used[i]
                    and (p.grad is None or (self.gradient_as_bucket_view and self._fresh[i]))
                ):
                    p.grad = None  # no rank used it and it had no gradient before
                elif p.grad is None:
                    p.grad = view if self.gradient_as_bucket_view else view.clone()
                elif p.grad is not view:
                    p.grad.copy_(view)

    def _rebuild(self) -> None:
        """Rebuild buckets once in rank 0's observed gradient-ready order, identically on every rank."""
        self._rebuilt = True
        seen = set(self._record or [])
        order = (self._record or []) + [i for i in reversed(range(len(self.params))) if i not in seen]
        self._record = None
        order_t = torch.tensor(order, dtype=torch.int64, device=self._buckets[0].buf.device)
        dist.broadcast(order_t, src=self._src, group=self.process_group)
        self._build_buckets(order_t.tolist())

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
