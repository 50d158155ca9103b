"""A small Transformer that learns to reverse sequences, with a learning-rate warm-up in an overridden
`optimizer_step` and an epoch-wise decay scheduler (the style of a widely used Transformer tutorial).

Lightning original imports: ``import lightning as L`` and ``from lightning.pytorch.callbacks import
LearningRateMonitor``. Only those lines changed.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from callbacks import LearningRateMonitor
from trainer import Task, Trainer, seed_everything


class ReverseDataset(Dataset):
    def __init__(self, num_categories: int, seq_len: int, size: int, seed: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.data = torch.randint(num_categories, size=(size, seq_len), generator=g)

    def __len__(self) -> int:
        return self.data.size(0)

    def __getitem__(self, idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        inp = self.data[idx]
        return inp, torch.flip(inp, dims=(0,))


class PositionalEncoding(nn.Module):
    def __init__(self, d_model: int, max_len: int = 64) -> None:
        super().__init__()
        pe = torch.zeros(max_len, d_model)
        position = torch.arange(0, max_len, dtype=torch.float).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2).float() * (-math.log(10000.0) / d_model))
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term)
        self.register_buffer("pe", pe.unsqueeze(0), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.pe[:, : x.size(1)]


class ReversePredictor(Task):
    def __init__(
        self, num_classes: int = 8, model_dim: int = 16, num_heads: int = 2, num_layers: int = 1,
        lr: float = 5e-3, warmup: int = 6, dropout: float = 0.1,
    ) -> None:  # fmt: skip
        super().__init__()
        self.save_hyperparameters()
        self.input_net = nn.Linear(num_classes, model_dim)
        self.positional_encoding = PositionalEncoding(model_dim)
        layer = nn.TransformerEncoderLayer(
            model_dim, num_heads, dim_feedforward=2 * model_dim, dropout=dropout, batch_first=True
        )
        self.transformer = nn.TransformerEncoder(layer, num_layers, enable_nested_tensor=False)
        self.output_net = nn.Sequential(
            nn.Linear(model_dim, model_dim), nn.LayerNorm(model_dim), nn.ReLU(inplace=True), nn.Dropout(dropout),
            nn.Linear(model_dim, num_classes),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.one_hot(x, num_classes=self.hparams.num_classes).float()
        x = self.positional_encoding(self.input_net(x))
        return self.output_net(self.transformer(x))

    def _calculate_loss(self, batch: Any, mode: str) -> torch.Tensor:
        inp, labels = batch
        preds = self(inp)
        loss = F.cross_entropy(preds.view(-1, preds.size(-1)), labels.view(-1))
        acc = (preds.argmax(dim=-1) == labels).float().mean()
        self.log(f"{mode}_loss", loss)
        self.log(f"{mode}_acc", acc)
        return loss

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self._calculate_loss(batch, mode="train")

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._calculate_loss(batch, mode="val")

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
        scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.8)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "epoch", "name": "decay"},
        }

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any) -> None:
        # linear warm-up over the first optimizer steps; the scheduler takes over afterwards
        if self.trainer.global_step < self.hparams.warmup:
            lr_scale = float(self.trainer.global_step + 1) / self.hparams.warmup
            for pg in optimizer.param_groups:
                pg["lr"] = lr_scale * self.hparams.lr
        optimizer.step(closure=optimizer_closure)


def main(**overrides: Any) -> dict[str, Any]:
    seed_everything(42)
    train_loader = DataLoader(ReverseDataset(8, 6, 256, seed=0), batch_size=64, shuffle=True, drop_last=True)
    val_loader = DataLoader(ReverseDataset(8, 6, 64, seed=1), batch_size=64)
    model = ReversePredictor()
    callbacks = [LearningRateMonitor(logging_interval="step"), *overrides.pop("callbacks", [])]
    options: dict[str, Any] = dict(accelerator="auto", devices=1, max_epochs=3, gradient_clip_val=5.0)
    options.update(overrides)
    trainer = Trainer(callbacks=callbacks, **options)
    trainer.fit(model, train_loader, val_loader)
    return {"model": model, "trainer": trainer}


if __name__ == "__main__":
    main()
