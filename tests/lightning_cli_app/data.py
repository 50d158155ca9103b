"""Generated data (no download): noisy waves, split into training, validation and test sets."""

import torch
from pytorch_lightning import LightningDataModule
from torch.utils.data import DataLoader, TensorDataset


class WavesData(LightningDataModule):
    def __init__(self, n: int = 96, batch_size: int = 8, noise: float = 0.05):
        super().__init__()
        self.save_hyperparameters()

    def setup(self, stage: str) -> None:
        g = torch.Generator().manual_seed(1234)
        x = torch.rand(self.hparams.n, 4, generator=g) * 6 - 3
        y = torch.sin(x).sum(1, keepdim=True) + self.hparams.noise * torch.randn(
            self.hparams.n, 1, generator=g
        )
        cut = self.hparams.n * 2 // 3
        self.train_set, self.val_set = TensorDataset(x[:cut], y[:cut]), TensorDataset(x[cut:], y[cut:])

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.hparams.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=self.hparams.batch_size)

    def test_dataloader(self):
        return DataLoader(self.val_set, batch_size=self.hparams.batch_size)
