"""Small tasks shared by tests/test_lightning_parity_callbacks.py and test_lightning_parity_checkpoint.py: the
same scenario as a Tandem Task and as a Lightning LightningModule."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from trainer import Task

pl = pytest.importorskip("pytorch_lightning")
QUIET = dict(enable_progress_bar=False, enable_model_summary=False, logger=False, num_sanity_val_steps=0)


def loader(n: int) -> DataLoader:
    return DataLoader(TensorDataset(torch.randn(n, 2)), batch_size=1)


class Calls(Task):
    """Records (epoch, batches done in the epoch) at each validation inside fit."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.calls: list[tuple[int, int]] = []
        self.done = 0

    def training_step(self, batch, batch_idx):
        self.done = batch_idx + 1
        return self.layer(batch[0]).sum()

    def validation_step(self, batch, batch_idx):
        pass

    def on_validation_start(self) -> None:
        self.calls.append((self.current_epoch, self.done))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return loader(5)

    def val_dataloader(self):
        return loader(2)


class LightningCalls(pl.LightningModule):
    training_step, validation_step, configure_optimizers = (
        Calls.training_step,
        Calls.validation_step,
        Calls.configure_optimizers,
    )
    on_validation_start, train_dataloader, val_dataloader = (
        Calls.on_validation_start,
        Calls.train_dataloader,
        Calls.val_dataloader,
    )

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.calls: list[tuple[int, int]] = []
        self.done = 0
