"""DDP checkpoints hold each rank's own state: two gloo ranks that draw different random numbers,
stopped inside a gradient-accumulation window and resumed by a new Trainer, end bit-identical to an
uninterrupted run."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from conftest import FAST, run_distributed
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from callbacks import Callback
from trainer import Task, Trainer, seed_everything

K = 3  # micro-batches per optimizer step
EPOCHS = 3
STOP = (1, 4)  # (epoch, batch_idx): 6 batches per rank and epoch, windows {0, 1, 2} and {3, 4, 5}


class Noisy(Task):
    """Dropout and a random loss weight: both differ by rank (each rank has its own RNG stream)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)  # the same initial weights on every rank and in every run
        self.net = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Dropout(0.5), nn.Linear(16, 1))
        self.draws: list[float] = []  # the random number of every training step

    def training_step(self, batch, batch_idx):
        x, y = batch
        weight = torch.rand(())
        self.draws.append(weight.item())
        return F.mse_loss(self.net(x), y) * (1.0 + weight)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


class Interrupted(Exception):
    """Stands for a crash right after a checkpoint was written."""


class SaveAndCrash(Callback):
    """Writes a checkpoint in on_train_batch_end at STOP, inside an accumulation window, then crashes."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_train_batch_end(self, trainer, task, outputs, batch, batch_idx):
        if (trainer.current_epoch, batch_idx) == STOP:
            trainer.save_checkpoint(self.path)
            raise Interrupted


def data() -> DataLoader:
    """48 samples, shuffled: each rank gets 24 per epoch (6 batches of 4)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(48, 4, generator=g)
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4, shuffle=True)


def _fit(rank: int, rng_seed: int, callbacks: list[Callback], ckpt_path: str | None = None) -> dict[str, Any]:
    seed_everything(0)  # the sampler's seed: the same in every run
    task = Noisy()
    torch.manual_seed(rng_seed + rank)  # each rank's own random stream
    trainer = Trainer(
        strategy="ddp", devices=2, max_epochs=EPOCHS, accumulate_grad_batches=K, callbacks=callbacks, **FAST
    )
    try:
        trainer.fit(task, data(), ckpt_path=ckpt_path)
    except Interrupted:
        pass
    state = {k: v.clone() for k, v in task.state_dict().items()}
    return {"draws": task.draws, "state": state, "step": trainer.global_step}


def _runs(rank: int, world_size: int, tmp: str) -> dict[str, Any]:
    path = os.path.join(tmp, "mid_window.ckpt")
    return {
        "full": _fit(rank, 10, []),
        "stopped": _fit(rank, 10, [SaveAndCrash(path)]),
        "resumed": _fit(rank, 999, [], ckpt_path=path),  # another RNG state: only the checkpoint's may count
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> list[dict[str, Any]]:
    """One two-process run (uninterrupted, stopped, resumed) serves every test of this file."""
    return run_distributed(_runs, str(tmp_path_factory.mktemp("ddp_resume")))


def test_the_ranks_draw_different_numbers_and_stop_inside_a_window(runs):
    full = [r["full"] for r in runs]
    assert full[0]["draws"] != full[1]["draws"]  # otherwise a checkpoint of rank 0's RNG alone would pass
    assert len(full[0]["draws"]) == EPOCHS * 6 and full[0]["step"] == EPOCHS * 2
    stopped = runs[0]["stopped"]
    assert len(stopped["draws"]) == 6 + STOP[1] + 1 and STOP[1] % K != K - 1  # mid-window
    assert stopped["step"] == 3  # two steps in epoch 0, one in epoch 1 before the window that was cut


def test_each_rank_resumes_its_own_random_stream(runs):
    for rank, r in enumerate(runs):
        assert r["stopped"]["draws"] + r["resumed"]["draws"] == r["full"]["draws"], f"rank {rank}"


def test_resumed_weights_are_bit_identical_on_every_rank(runs):
    for rank, r in enumerate(runs):
        assert r["resumed"]["step"] == r["full"]["step"]
        for name, value in r["full"]["state"].items():
            assert torch.equal(r["resumed"]["state"][name], value), f"rank {rank} {name}"
            assert torch.equal(runs[0]["full"]["state"][name], value)  # DDP keeps the ranks in step
