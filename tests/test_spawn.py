"""strategy="ddp_spawn" (Lightning's): the workers start from this process with the trainer, task and data
pickled, train on our reducer, and rank 0's weights, loop state, metrics and callback state come back here.
A run equals one process on the concatenated batches; what cannot be pickled is refused before any start."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from callbacks import Callback
from strategies import DDPStrategy
from tandem_core.errors import ConfigError
from trainer import Task, Trainer
from trainer.loggers import Logger


class Net(Task):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.net = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.cross_entropy(self.net(x), y), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Counter(Callback):
    """Counts its batches in the worker; its state comes back to this process."""

    def __init__(self) -> None:
        self.batches = 0

    def on_train_batch_end(self, trainer, task, outputs, batch, batch_idx):
        self.batches += 1

    def state_dict(self):
        return {"batches": self.batches}

    def load_state_dict(self, state):
        self.batches = state["batches"]


class RankFiles(Logger):
    """Writes each call's metric names into a file named by the process's rank (Lightning calls a logger on every
    rank; Tandem on rank 0 only: docs/porting.md, deliberate differences)."""

    def __init__(self, root) -> None:
        super().__init__(save_dir=str(root), name="rank_files", version=0)
        self.root = root

    def log_metrics(self, metrics, step=None) -> None:
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else -1
        with open(self.root / f"rank{rank}.txt", "a") as f:
            f.write(" ".join(sorted(metrics)) + "\n")


def data(n: int = 32) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g))


def trainer(strategy, devices, callbacks=(), logger=False) -> Trainer:
    return Trainer(
        strategy=strategy, devices=devices, accelerator="cpu", max_epochs=2, logger=logger,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=list(callbacks), num_sanity_val_steps=0,
    )  # fmt: skip


def test_an_unpicklable_task_is_refused_before_any_worker_starts():
    task = Net()
    task.scale = lambda x: 2 * x  # a lambda cannot be pickled
    with pytest.raises(ConfigError, match="ddp_spawn.*cannot be pickled.*strategy='ddp'"):
        trainer("ddp_spawn", 2).fit(task, DataLoader(data(), batch_size=4))


def test_spawn_and_forkserver_are_start_methods_and_others_are_refused():
    assert DDPStrategy(start_method="spawn").start_method == "spawn"
    assert DDPStrategy(start_method="forkserver").start_method == "forkserver"
    with pytest.raises(ConfigError, match="start_method must be one of"):
        DDPStrategy(start_method="threads")


@pytest.mark.slow
def test_ddp_spawn_trains_as_one_process_and_brings_the_results_back(tmp_path):
    # two ranks with batches of 4 (a DistributedSampler without shuffling: rank r takes samples r, r+2, ...)
    # step as one process on batches of 8 in the same order
    task, counter = Net(), Counter()
    t = trainer("ddp_spawn", 2, [counter], logger=RankFiles(tmp_path))
    t.fit(task, DataLoader(data(), batch_size=4), DataLoader(data(8), batch_size=4))
    ref = Net()
    trainer("single", 1).fit(ref, DataLoader(data(), batch_size=8))
    for p, q in zip(task.parameters(), ref.parameters()):
        assert torch.allclose(p, q, atol=1e-6), (p - q).abs().max()
    assert t.global_step == 8 and t.current_epoch == 2  # the loop state came back
    assert counter.batches == 8  # the callback's state came back
    assert set(t.callback_metrics) >= {"train_loss", "val_loss"}
    # the logger was called on rank 0 only (Lightning calls a logger on every rank)
    assert sorted(p.name for p in tmp_path.glob("rank*.txt")) == ["rank0.txt"]
    assert "val_loss" in (tmp_path / "rank0.txt").read_text()
    out = t.validate(task, DataLoader(data(8), batch_size=4), verbose=False)  # spawned again, its result back
    assert out[0]["val_loss"] == pytest.approx(float(t.callback_metrics["val_loss"]), rel=1e-6)
