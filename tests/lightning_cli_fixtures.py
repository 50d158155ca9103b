"""Twin classes for tests/test_config_lightning.py: the same model and data module written once on
Tandem's Task/DataModule and once on Lightning's LightningModule/LightningDataModule (as a user porting a
LightningCLI project would have them), so that one config can be built by both and the results compared."""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from trainer import DataModule, Task

HERE = __name__


def _layers(width: int, hidden: int, act: torch.nn.Module | None) -> torch.nn.Sequential:
    return torch.nn.Sequential(
        torch.nn.Linear(width, hidden), act or torch.nn.Identity(), torch.nn.Linear(hidden, 1)
    )


def _loaders(n: int, width: int, batch_size: int) -> tuple[DataLoader, DataLoader]:
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(n, width, generator=g), torch.randn(n, 1, generator=g))
    return DataLoader(data, batch_size=batch_size), DataLoader(data, batch_size=batch_size)


class Net(Task):
    """A regressor with no configure_optimizers: the config's optimizer section gives it one."""

    def __init__(
        self, width: int = 4, hidden: int = 8, lr: float = 0.1, act: torch.nn.Module | None = None
    ) -> None:
        super().__init__()
        self.save_hyperparameters(ignore="act")
        self.net = _layers(width, hidden, act)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val/loss", torch.nn.functional.mse_loss(self.net(x), y))


class NetWithOptimizers(Net):
    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


class Data(DataModule):
    def __init__(self, n: int = 32, width: int = 4, batch_size: int = 4) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.train, self.val = _loaders(n, width, batch_size)

    def train_dataloader(self) -> DataLoader:
        return self.train

    def val_dataloader(self) -> DataLoader:
        return self.val


class PLNet(pl.LightningModule):
    """Net, on Lightning."""

    def __init__(
        self, width: int = 4, hidden: int = 8, lr: float = 0.1, act: torch.nn.Module | None = None
    ) -> None:
        super().__init__()
        self.save_hyperparameters(ignore="act")
        self.net = _layers(width, hidden, act)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)


class PLData(pl.LightningDataModule):
    def __init__(self, n: int = 32, width: int = 4, batch_size: int = 4) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.train, self.val = _loaders(n, width, batch_size)

    def train_dataloader(self) -> DataLoader:
        return self.train
