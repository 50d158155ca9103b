"""A small regressor with a scheduler: what a LightningCLI project's model module looks like."""

import torch
from pytorch_lightning import LightningModule
from torch import nn


class WaveRegressor(LightningModule):
    def __init__(self, hidden: int = 16, lr: float = 0.05, gamma: float = 0.5, dropout: float = 0.1):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(4, hidden), nn.Tanh(), nn.Dropout(dropout), nn.Linear(hidden, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.log("train/loss", loss, on_step=True, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        pred = self(x)
        self.log("val/loss", nn.functional.mse_loss(pred, y))
        self.log("val/mae", (pred - y).abs().mean())

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test/loss", nn.functional.mse_loss(self(x), y))

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)
        scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=self.hparams.gamma)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "epoch"}}
