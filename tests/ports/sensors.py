"""A regression on quantised sensor readings with a custom batch class: the data is prepared by the model
itself (`prepare_data`/`setup`/`*_dataloader` on the LightningModule), training batches are jittered on the
host (`on_before_batch_transfer`), moved by `transfer_batch_to_device`, turned into standardised floats on the
device (`on_after_batch_transfer`), and a batch with a corrupted record is skipped by returning None from
`training_step`. The style of Lightning's documentation examples for these hooks.

Lightning original import: ``import lightning as L``. Only that line changed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainer import Task, Trainer, seed_everything

N_TRAIN, N_VAL, CORRUPTED = 512, 128, (64, 65, 320, 321)


@dataclass
class SensorBatch:
    readings: torch.Tensor  # uint8, (batch, 16)
    target: torch.Tensor  # float, (batch,)


def collate(samples: list[tuple[torch.Tensor, torch.Tensor]]) -> SensorBatch:
    return SensorBatch(torch.stack([s[0] for s in samples]), torch.stack([s[1] for s in samples]))


def generate_recordings(n: int = N_TRAIN + N_VAL, seed: int = 11) -> dict[str, torch.Tensor]:
    """Readings 0..255 from 16 sensors and a smooth target; a few records were corrupted (NaN target)."""
    g = torch.Generator().manual_seed(seed)
    readings = torch.randint(0, 256, (n, 16), generator=g, dtype=torch.uint8)
    x = readings.float() / 255
    target = torch.sin(3 * x[:, :4].sum(1)) + 0.5 * x[:, 4:8].mean(1) + 0.05 * torch.randn(n, generator=g)
    target[list(CORRUPTED)] = float("nan")
    return {"readings": readings, "target": target}


class SensorRegressor(Task):
    def __init__(self, data_dir: str = "./sensor_data", batch_size: int = 32, lr: float = 0.05) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
        self.register_buffer("mean", torch.zeros(16))
        self.register_buffer("std", torch.ones(16))

    @property
    def data_file(self) -> str:
        return os.path.join(self.hparams.data_dir, "recordings.pt")

    def prepare_data(self) -> None:
        if not os.path.exists(self.data_file):  # the "download"
            os.makedirs(self.hparams.data_dir, exist_ok=True)
            torch.save(generate_recordings(), self.data_file)

    def setup(self, stage: str) -> None:
        data = torch.load(self.data_file)
        readings, target = data["readings"], data["target"]
        self.train_set = TensorDataset(readings[:N_TRAIN], target[:N_TRAIN])
        self.val_set = TensorDataset(readings[N_TRAIN:], target[N_TRAIN:])
        scaled = readings[:N_TRAIN].float() / 255
        self.mean.copy_(scaled.mean(0))
        self.std.copy_(scaled.std(0))

    def train_dataloader(self) -> DataLoader:
        # recordings are a time series: keep their order
        return DataLoader(
            self.train_set, batch_size=self.hparams.batch_size, shuffle=False, collate_fn=collate
        )

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=self.hparams.batch_size, collate_fn=collate)

    def on_before_batch_transfer(self, batch: SensorBatch, dataloader_idx: int) -> SensorBatch:
        if self.trainer.training:  # jitter the raw training readings by a few counts (runs on the host)
            noise = torch.randint(-2, 3, batch.readings.shape, dtype=torch.int16)
            batch.readings = (batch.readings.to(torch.int16) + noise).clamp(0, 255).to(torch.uint8)
        return batch

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        if isinstance(batch, SensorBatch):
            batch.readings = batch.readings.to(device)
            batch.target = batch.target.to(device)
            return batch
        return super().transfer_batch_to_device(batch, device, dataloader_idx)

    def on_after_batch_transfer(self, batch: SensorBatch, dataloader_idx: int) -> SensorBatch:
        # bytes travel to the device (4x less traffic than floats); standardise them there
        batch.readings = (batch.readings.float() / 255 - self.mean) / self.std
        return batch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).squeeze(1)

    def training_step(self, batch: SensorBatch, batch_idx: int) -> torch.Tensor | None:
        if torch.isnan(batch.target).any():
            return None  # a corrupted record: skip this batch
        loss = F.mse_loss(self(batch.readings), batch.target)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: SensorBatch, batch_idx: int) -> None:
        ok = ~torch.isnan(batch.target)
        loss = F.mse_loss(self(batch.readings[ok]), batch.target[ok])
        self.log("val_loss", loss, batch_size=int(ok.sum()), prog_bar=True)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)


def main(data_dir: str = "./sensor_data", **overrides: Any) -> dict[str, Any]:
    seed_everything(5)
    model = SensorRegressor(data_dir=data_dir)
    options: dict[str, Any] = dict(max_epochs=3, accelerator="auto", devices=1)
    options.update(overrides)
    trainer = Trainer(**options)
    trainer.fit(model)
    return {"model": model, "trainer": trainer}


if __name__ == "__main__":
    main()
