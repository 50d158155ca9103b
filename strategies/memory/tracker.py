"""Counting the bytes of live tensors as a step runs: every storage an op creates is counted until it is freed
(or resized: FSDP frees and refills its gathered parameters that way). On fake tensors it counts what the same
step would allocate for real, without allocating it; that is how the memory plan predicts a peak."""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class LiveBytes(TorchDispatchMode):
    """``with LiveBytes() as live: ...``; then `live.peak` (bytes) and `live.now`. `track(t)` counts a tensor
    made outside (a batch); a DTensor counts its local shard. `live.at_peak` holds the storages alive at the
    peak (key -> bytes; taken within 0.5% of it) and `live.groups` what `probe()` said they were then (name ->
    storage keys, `key_of`), for attributing the peak."""

    def __init__(self, probe: Callable[[], dict[str, set[int]]] | None = None) -> None:
        super().__init__()
        self.probe = probe  # what the storages are (name -> keys), asked at the peak
        self.groups: dict[str, set[int]] = {}
        self._sizes: dict[int, list[Any]] = {}  # storage key -> [weak reference, bytes]
        self.now = self.peak = 0
        self.at_peak: dict[int, int] = {}
        self._snapped = 0
        self._resize: Any = None

    @staticmethod
    def key_of(t: torch.Tensor) -> int:
        """The key of the storage behind `t` (a DTensor's local shard)."""
        return _local(t).untyped_storage()._cdata

    @staticmethod
    def keys(tensors: Any) -> set[int]:
        """The storage keys of the non-meta tensors among `tensors`."""
        return {LiveBytes.key_of(t) for t in tensors if isinstance(t, torch.Tensor) and not t.is_meta}

    def track(self, t: Any) -> None:
        """Count `t`'s storage (once) until it is freed."""
        if isinstance(t, torch.Tensor) and not t.is_meta:  # (meta tensors hold no memory; fake ones would)
            self._add(_local(t).untyped_storage())

    def _add(self, storage: Any) -> None:
        key = storage._cdata
        if key in self._sizes:
            return
        size = storage.nbytes()
        self._sizes[key] = [weakref.ref(storage, functools.partial(self._gone, key)), size]
        self._grow(size)

    def _grow(self, delta: int) -> None:
        self.now += delta
        if self.now > self.peak:
            self.peak = self.now
            if self.now > self._snapped * 1.005:  # (within 0.5% of the peak: cheap enough on every op)
                self.at_peak = {k: v[1] for k, v in self._sizes.items()}
                self.groups = self.probe() if self.probe is not None else {}
                self._snapped = self.now

    def _gone(self, key: int, _: Any) -> None:
        entry = self._sizes.pop(key, None)
        if entry is not None:
            self.now -= entry[1]

    def __enter__(self) -> LiveBytes:
        self._resize = torch.UntypedStorage.resize_
        original, tracker = self._resize, self

        def resize_(storage: Any, size: int) -> Any:
            out = original(storage, size)
            entry = tracker._sizes.get(storage._cdata)
            if entry is None:
                tracker._add(storage)
            else:
                delta, entry[1] = size - entry[1], size
                tracker._grow(delta)
            return out

        torch.UntypedStorage.resize_ = resize_  # type: ignore[method-assign]
        return super().__enter__()  # type: ignore[return-value]

    def __exit__(self, *args: Any) -> None:
        torch.UntypedStorage.resize_ = self._resize  # type: ignore[method-assign]
        super().__exit__(*args)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            self.track(t)
        return out


def _local(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t._local_tensor if isinstance(t, DTensor) else t
