"""Tasks and a fit helper shared by the callback tests (imported by them; holds no tests)."""

from __future__ import annotations

import os

import torch
from conftest import FAST
from torch.utils.data import DataLoader, TensorDataset

from callbacks import Callback
from trainer import Task, Trainer

# FAST, but with checkpointing on: most callback tests are about what ModelCheckpoint writes
QUIET = {**FAST, "enable_checkpointing": True}


def loader(n: int = 8, batch_size: int = 4, seed: int = 0) -> DataLoader:
    """`n` random 2-feature samples in batches of `batch_size`."""
    g = torch.Generator().manual_seed(seed)
    return DataLoader(TensorDataset(torch.randn(n, 2, generator=g)), batch_size=batch_size)


class Scored(Task):
    """Two steps per epoch; validation logs a score chosen by the test for each epoch."""

    def __init__(self, scores: list[float] | None = None, lr: float = 0.1) -> None:
        super().__init__()
        self.scores = scores or [0.0] * 100
        self.lr = lr
        self.net = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        loss = self.net(batch[0]).pow(2).mean()
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val/score", float(self.scores[self.current_epoch]), prog_bar=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def fit(
    task: Task,
    callbacks: list[Callback],
    epochs: int,
    val: bool = True,
    ckpt_path: str | None = None,
    **kwargs,
) -> Trainer:
    """Fit `task` for `epochs` on loader() (and loader(2, 2) for validation when `val`)."""
    trainer = Trainer(max_epochs=epochs, callbacks=callbacks, **{**QUIET, **kwargs})
    trainer.fit(task, loader(), loader(2, 2) if val else None, ckpt_path=ckpt_path)
    return trainer


class CountFiles(Callback):
    """Records the most files `dirpath` held at any epoch end."""

    def __init__(self, dirpath: str) -> None:
        self.dirpath, self.most = dirpath, 0

    def on_train_epoch_end(self, trainer, task):
        if os.path.isdir(self.dirpath):
            self.most = max(self.most, len(os.listdir(self.dirpath)))
