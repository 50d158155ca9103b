"""Our Reducer's overlap under torch.compile: the compiled graph is split at bucket boundaries.

With AOTAutograd a compiled graph's backward hands autograd every parameter's gradient at once, when the
whole graph's backward ends: every bucket of the Reducer would become ready at the end of backward and no
all-reduce would overlap it. Torch's own answer for its DDP is DDPOptimizer
(torch/_dynamo/backends/distributed.py): it cuts the graph, in reverse order, into pieces whose parameters
fill about one bucket (the first 1 MB, the rest `bucket_bytes_cap`: the same rule as our Reducer's
buckets) and compiles each piece with the user's backend. A piece's gradients then arrive when its own
backward ends; the Reducer's hooks fire and that bucket's all-reduce overlaps the rest of backward.

Dynamo applies DDPOptimizer to a frame it compiles while a DDP module is active: the class attribute that
torch's DistributedDataParallel (and its composable ``replicate``) set during their forward, of which dynamo
reads only ``bucket_bytes_cap``. `BucketSplits` sets it, for the duration of our steps, to a view of the
Reducer's bucket cap: torch's splitter, our buckets, the user's backend.
"""

from __future__ import annotations

from types import TracebackType

import torch
from torch.nn.parallel import DistributedDataParallel


class BucketSplits:
    """``with BucketSplits(cap_bytes): step()``: frames dynamo compiles inside are split at bucket size.

    Torch's splitter cuts its first piece at 1 MB and refuses a smaller cap for the others, so a
    `bucket_cap_mb` below 1 gives 1 MB pieces (each holding several of the small buckets)."""

    def __init__(self, bucket_bytes_cap: int) -> None:
        first = torch.distributed._DEFAULT_FIRST_BUCKET_BYTES
        self.bucket_bytes_cap = max(bucket_bytes_cap, first)  # the one attribute dynamo reads
        self._previous: object = None

    def __enter__(self) -> BucketSplits:
        self._previous = DistributedDataParallel._active_ddp_module
        DistributedDataParallel._active_ddp_module = self  # type: ignore[assignment]
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        DistributedDataParallel._active_ddp_module = self._previous  # type: ignore[assignment]


def splits_unavailable() -> str | None:
    """Why this torch cannot split compiled graphs at bucket boundaries, or None when it can."""
    if not hasattr(DistributedDataParallel, "_active_ddp_module"):
        return f"torch {torch.__version__} has no DDP hook for dynamo's DDPOptimizer"
    from torch._dynamo.utils import get_optimize_ddp_mode

    mode = get_optimize_ddp_mode()
    if mode != "ddp_optimizer":
        return f"torch._dynamo.config.optimize_ddp is {mode!r}, not 'ddp_optimizer'"
    return None
