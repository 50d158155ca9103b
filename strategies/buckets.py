"""Gradient buckets: which parameters share a flat buffer, the buffers, the .grad views and their statistics."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn


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
    wait_s: float = 0.0  # blocked in wait() inside finalize: communication not hidden by backward
    done_s: float = 0.0  # wait() returned (an upper bound on when the all_reduce finished)


@dataclass
class AutoBuckets:
    """What bucket_cap_mb="auto" measured (on rank 0) and chose; identical on every rank."""

    alpha_s: float  # all-reduce latency per message (alpha-beta model)
    beta_s: float  # all-reduce seconds per byte
    cpu_alpha_s: float  # ... the part of alpha that needs the rank's CPU (waits while backward runs)
    cpu_beta_s: float  # ... and of beta
    compute_rate: float  # backward's speed while an all-reduce is in flight (1: unaffected)
    probes: dict[int, float]  # probe bytes -> seconds of one all-reduce (fastest repetition)
    probes_cpu_s: dict[int, float]  # probe bytes -> seconds of it that did not progress next to compute
    ready_s: list[float]  # per parameter: when its gradient was ready, seconds after backward started
    backward_s: float  # when the last gradient was ready
    outside_s: float  # between two backwards: optimizer step, zero_grad and forward
    buckets: list[list[int]]  # the chosen buckets (parameter indices, launch order)
    bucket_mb: list[float]  # their sizes
    predicted_step_s: float  # cost-model step time with the chosen buckets
    predicted_step_s_cap25: float  # ... and with the fixed default cap of 25 MB
    kept_cap25: bool  # the predicted gain was under AUTO_MIN_GAIN: the 25 MB buckets were kept, no trial
    sync_s_cap25: float  # median backward + finalize with the 25 MB buckets on rank 0 (in the trial, if any)
    sync_s_trial: float | None = None  # ... with the chosen buckets, in the trial (None: no trial)
    trial_wins: int | None = None  # trial pairs in which the chosen buckets were the faster
    reverted: bool = False  # the chosen buckets did not win the trial: the 25 MB ones were kept


@dataclass(slots=True)
class Bucket:
    """One flat gradient buffer, the parameters laid out in it and its in-flight work."""

    index: int
    params: list[int]
    buf: torch.Tensor
    comp: torch.Tensor | None  # the fp16/bf16 copy that travels, with a compression hook
    pending: int = 0
    work: dist.Work | None = None


def assign_buckets(
    sizes: list[int], keys: list[object], order: list[int], first_cap: int, cap: int
) -> list[list[int]]:
    """Group indices (visited in `order`) into buckets of one key each; a key's first bucket <= first_cap."""
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
        filled[key] = (filled[key] if current else 0) + sizes[i]
        current.append(i)
    done.extend(b for b in open_.values() if b)
    # Launch order follows the expected gradient order, whatever the bucket's dtype or device.
    position = {i: k for k, i in enumerate(order)}
    return sorted(done, key=lambda bucket: position[bucket[0]])


class BucketLayout:
    """Parameters laid out in flat per-bucket buffers, with one view per parameter that can serve as .grad."""

    def __init__(
        self,
        params: list[nn.Parameter],
        names: list[str],
        first_cap: int,
        cap: int,
        comp_dtype: torch.dtype | None,
        as_view: bool,
    ) -> None:
        self.params, self.names = params, names
        self.first_cap, self.cap, self.comp_dtype = first_cap, cap, comp_dtype
        self.as_view = as_view  # gradient_as_bucket_view: .grad aliases the bucket instead of being copied
        self.buckets: list[Bucket] = []
        self.bucket_of: list[Bucket] = []
        self.views: list[torch.Tensor] = []
        self.fresh = [False] * len(params)  # .grad was None when the backward was armed

    @property
    def indices(self) -> list[list[int]]:
        """Parameter indices per bucket, in launch order."""
        return [list(b.params) for b in self.buckets]

    @property
    def sizes(self) -> list[int]:
        """Bytes of each parameter's gradient."""
        return [p.numel() * p.element_size() for p in self.params]

    @property
    def keys(self) -> list[object]:
        """(device, dtype) of each parameter: only parameters of one key share a bucket."""
        return [(p.device, p.dtype) for p in self.params]

    def sibling(self, assignment: list[list[int]]) -> BucketLayout:
        """Another layout of the same parameters (new buffers) in the given buckets; .grad moves to it."""
        other = BucketLayout(self.params, self.names, self.first_cap, self.cap, self.comp_dtype, self.as_view)
        other.build_groups(assignment)
        return other

    def build(self, order: list[int]) -> None:
        """Lay parameters out in flat buffers following `order`, keeping any existing .grad values."""
        self.build_groups(assign_buckets(self.sizes, self.keys, order, self.first_cap, self.cap))

    def build_groups(self, assignment: list[list[int]]) -> None:
        """Lay parameters out in the given buckets (parameter indices, launch order), keeping .grad values."""
        sizes = self.sizes
        if assignment == self.indices:
            return  # nothing moves: keep the buffers (and the .grad views into them)
        self.buckets = []
        self.views = [torch.empty(0)] * len(sizes)  # placeholders, all replaced below
        self.bucket_of = [None] * len(sizes)  # type: ignore[list-item]
        for index, members in enumerate(assignment):
            like = self.params[members[0]]
            buf = torch.zeros(
                sum(self.params[i].numel() for i in members), dtype=like.dtype, device=like.device
            )
            compress = self.comp_dtype is not None and like.is_floating_point() and like.element_size() > 2
            bucket = Bucket(index, members, buf, buf.to(self.comp_dtype) if compress else None)
            self.buckets.append(bucket)
            for i, view in zip(members, buf.split([self.params[i].numel() for i in members])):
                self.views[i], self.bucket_of[i] = view.view_as(self.params[i]), bucket
        with torch.no_grad():  # gradients already there (the first iteration's) move to the new buffers
            for p, view in zip(self.params, self.views):
                if p.grad is not None:
                    view.copy_(p.grad)
                    if self.as_view:
                        p.grad = view

    def new_stats(self) -> list[BucketStats]:
        """Empty statistics, one per bucket."""
        stats = []
        for b in self.buckets:
            names = [self.names[i] for i in b.params]
            nbytes = b.buf.numel() * b.buf.element_size()
            stats.append(BucketStats(b.index, b.buf.numel(), nbytes, b.buf.dtype, b.buf.device, names))
        return stats

    def attach_views(self) -> None:
        """Point every .grad at its bucket slot so AccumulateGrad adds in place (zero_grad may have set None)."""
        self.fresh = [p.grad is None for p in self.params]  # unused by every rank -> back to None, as DDP
        with torch.no_grad():
            for b in self.buckets:
                whole = all(self.fresh[i] for i in b.params)
                if whole:
                    b.buf.zero_()  # one fill per bucket rather than one per parameter
                for i in b.params:
                    p, view = self.params[i], self.views[i]
                    if p.grad is None and not whole:
                        view.zero_()
                    elif p.grad is not None and p.grad is not view:
                        view.copy_(p.grad)
                    if p.grad is not view:
                        p.grad = view

    def stage(self, i: int) -> Bucket:
        """Put parameter i's gradient (zero if it has none) in its bucket slot; return the bucket, one fewer pending."""
        grad, view = self.params[i].grad, self.views[i]
        if grad is None:
            view.zero_()  # unused here: contributes nothing, and .grad stays None for now
        elif grad is not view:  # copy mode, or AccumulateGrad replaced the view with a new tensor
            view.copy_(grad)
            if self.as_view:
                self.params[i].grad = view
        bucket = self.bucket_of[i]
        bucket.pending -= 1
        return bucket

    def write_grads(self, used: list[int] | None) -> None:
        """Expose the averaged buckets as .grad, keeping None for parameters that no rank used."""
        with torch.no_grad():
            for i, p in enumerate(self.params):
                view = self.views[i]
                if used is not None and not used[i] and (p.grad is None or (self.as_view and self.fresh[i])):
                    p.grad = None
                elif p.grad is None:
                    p.grad = view if self.as_view else view.clone()
                elif p.grad is not view:
                    p.grad.copy_(view)
