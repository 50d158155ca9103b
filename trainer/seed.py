"""Seeding and capturing/restoring every random number generator, for reproducible and resumable runs."""

from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Iterator
from typing import Any

import torch

try:  # numpy is optional
    import numpy as np
except ImportError:  # pragma: no cover
    np = None  # type: ignore[assignment]


def seed_everything(seed: int | None = None, workers: bool = False) -> int:
    """Seed python, numpy and torch (all devices); with workers=True loaders seed their workers too.

    Example: ``seed_everything(42, workers=True)``.
    """
    if seed is None:
        seed = int(os.environ.get("TANDEM_GLOBAL_SEED", 0))
    seed = int(seed)
    os.environ["TANDEM_GLOBAL_SEED"] = str(seed)
    os.environ["TANDEM_SEED_WORKERS"] = "1" if workers else "0"
    random.seed(seed)
    if np is not None:
        np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    return seed


def worker_init_fn(worker_id: int) -> None:
    """Seed python and numpy in a DataLoader worker from torch's per-worker seed (differs by rank too)."""
    rank = int(os.environ.get("RANK", 0))
    seed = (torch.initial_seed() + 1000003 * rank) % 2**32
    random.seed(seed)
    if np is not None:
        np.random.seed(seed)


def get_rng_state() -> dict[str, Any]:
    """Snapshot of every generator's state (python, numpy, torch CPU and CUDA)."""
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if np is not None:  # as plain data (a tensor, not an ndarray), so checkpoints load with weights_only=True
        kind, keys, pos, has_gauss, gauss = np.random.get_state()
        state["numpy"] = (
            kind,
            torch.from_numpy(keys.astype(np.int64)),
            int(pos),
            int(has_gauss),
            float(gauss),
        )
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore a snapshot taken by get_rng_state."""
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if np is not None and "numpy" in state:
        kind, keys, pos, has_gauss, gauss = state["numpy"]
        keys = keys.numpy() if isinstance(keys, torch.Tensor) else np.asarray(keys)
        np.random.set_state((kind, keys.astype(np.uint32), pos, has_gauss, gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


@contextlib.contextmanager
def isolate_rng(include_cuda: bool = True) -> Iterator[None]:
    """Give back python's, numpy's and torch's generators (CUDA's too, with `include_cuda`) as they were on entry,
    whatever the block draws (Lightning's ``lightning.pytorch.utilities.seed.isolate_rng``).

    Example: ``with isolate_rng(): noise = torch.rand(3)`` leaves the next ``torch.rand`` unchanged."""
    state = {k: v for k, v in get_rng_state().items() if k != "cuda"}
    cuda = (torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []) if include_cuda else None
    try:
        yield
    finally:
        set_rng_state(state)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
