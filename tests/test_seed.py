"""trainer/seed.py: seed_everything makes python, numpy and torch reproducible; RNG snapshots restore
every generator exactly (also through torch.save, as in checkpoints); DataLoader workers get distinct
numpy seeds."""

from __future__ import annotations

import io
import os
import random
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from conftest import FAST
from torch import nn
from torch.utils.data import DataLoader, Dataset

from trainer import Task, Trainer, seed_everything
from trainer.seed import get_rng_state, set_rng_state, worker_init_fn

SEED_VARS = ("TANDEM_GLOBAL_SEED", "TANDEM_SEED_WORKERS", "RANK")


@pytest.fixture(autouse=True)
def seed_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """seed_everything writes os.environ itself: put the variables back afterwards."""
    saved = {k: os.environ.get(k) for k in SEED_VARS}
    for var in SEED_VARS:
        monkeypatch.delenv(var, raising=False)
    yield monkeypatch
    monkeypatch.undo()
    for var, value in saved.items():
        if value is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = value


def draws() -> tuple[float, float, torch.Tensor]:
    """One draw from each generator: python, numpy, torch."""
    return random.random(), float(np.random.rand()), torch.rand(3)


def assert_same_draws(a: tuple, b: tuple) -> None:
    """Every generator gave the same value."""
    assert a[0] == b[0], "python"
    assert a[1] == b[1], "numpy"
    assert torch.equal(a[2], b[2]), "torch"


def assert_all_differ(a: tuple, b: tuple) -> None:
    """Every generator gave another value."""
    assert a[0] != b[0], "python"
    assert a[1] != b[1], "numpy"
    assert not torch.equal(a[2], b[2]), "torch"


def test_seed_everything_reproduces_every_generator():
    assert seed_everything(7) == 7
    first = draws()
    draws()
    seed_everything(7)
    assert_same_draws(draws(), first)
    seed_everything(8)
    assert_all_differ(draws(), first)


def test_seed_everything_accepts_seeds_beyond_32_bits():
    seed_everything(2**40 + 3)
    first = draws()
    seed_everything(2**40 + 3)
    assert_same_draws(draws(), first)


def test_seed_everything_records_the_seed_for_the_sampler_and_workers():
    seed_everything(11, workers=True)
    assert os.environ["TANDEM_GLOBAL_SEED"] == "11" and os.environ["TANDEM_SEED_WORKERS"] == "1"
    seed_everything(12)
    assert os.environ["TANDEM_GLOBAL_SEED"] == "12" and os.environ["TANDEM_SEED_WORKERS"] == "0"


def test_seed_everything_without_a_seed_reuses_the_recorded_one_or_zero():
    assert seed_everything() == 0
    zero = draws()
    os.environ["TANDEM_GLOBAL_SEED"] = "5"  # e.g. set by the parent process of a DDP worker
    assert seed_everything() == 5
    five = draws()
    seed_everything(5)
    assert_same_draws(draws(), five)
    assert_all_differ(five, zero)


def test_rng_state_round_trip_restores_every_generator():
    seed_everything(3)
    draws()
    state = get_rng_state()
    expected = draws()
    draws()  # move every generator on; the snapshot must not move with them
    set_rng_state(state)
    assert_same_draws(draws(), expected)


def test_rng_state_survives_torch_save_like_a_checkpoint():
    seed_everything(4)
    buf = io.BytesIO()
    torch.save(get_rng_state(), buf)
    expected = draws()
    seed_everything(99)
    set_rng_state(torch.load(io.BytesIO(buf.getvalue()), weights_only=False))
    assert_same_draws(draws(), expected)


def test_a_snapshot_without_numpy_restores_the_rest():
    seed_everything(6)
    state = {k: v for k, v in get_rng_state().items() if k != "numpy"}  # e.g. written without numpy
    expected = draws()
    np.random.seed(123)
    numpy_next = np.random.rand()
    np.random.seed(123)
    set_rng_state(state)
    got = draws()
    assert got[0] == expected[0] and torch.equal(got[2], expected[2])
    assert got[1] == numpy_next  # numpy is left where it was


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_rng_state_round_trip_on_cuda():
    seed_everything(5)
    torch.rand(2, device="cuda")
    state = get_rng_state()
    assert "cuda" in state
    expected = torch.rand(4, device="cuda")
    seed_everything(6)
    set_rng_state(state)
    assert torch.equal(torch.rand(4, device="cuda"), expected)


# ----- DataLoader workers -----------------------------------------------------------------------------------
def test_worker_init_fn_seeds_from_torch_and_the_rank(seed_env):
    def worker_draws(rank: str, torch_seed: int) -> tuple[float, float]:
        seed_env.setenv("RANK", rank)
        torch.manual_seed(torch_seed)  # torch.initial_seed() is what a worker gets from the loader
        worker_init_fn(0)
        return random.random(), float(np.random.rand())

    base = worker_draws("0", 1)
    assert worker_draws("0", 1) == base
    other_rank, other_seed = worker_draws("1", 1), worker_draws("0", 2)
    assert other_rank[0] != base[0] and other_rank[1] != base[1]
    assert other_seed[0] != base[0] and other_seed[1] != base[1]


class NumpyNoise(Dataset):
    """Each item is a numpy random number drawn in the worker that loads it."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([np.random.rand()], dtype=torch.float32)


class Collect(Task):
    """Records the value of every training batch."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(1, 1)
        self.values: list[float] = []

    def training_step(self, batch, batch_idx):
        self.values.append(float(batch[0, 0]))
        return self.lin(batch).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _worker_values(env: pytest.MonkeyPatch, rank: str) -> list[float]:
    """The items one seeded epoch reads through two workers, in batch order, as rank `rank` would."""
    env.setenv("RANK", rank)  # what a DDP worker has; the loader's workers inherit it
    seed_everything(0, workers=True)
    task = Collect()
    loader = DataLoader(NumpyNoise(), batch_size=1, num_workers=2)  # batches 0, 2 from worker 0; 1, 3 from 1
    Trainer(max_epochs=1, **FAST).fit(task, loader)
    return task.values


def test_seed_everything_with_workers_gives_each_rank_and_worker_its_own_numpy_stream(seed_env):
    first = _worker_values(seed_env, "0")
    assert len(set(first)) == 4  # the two workers do not repeat each other
    assert _worker_values(seed_env, "0") == first  # reproducible
    # the same seed on another rank (DDP ranks share it): other augmentations, not a copy of rank 0's
    other = _worker_values(seed_env, "1")
    assert not set(other) & set(first)
