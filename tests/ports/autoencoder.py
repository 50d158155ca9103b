"""An autoencoder on the 8x8 digits with a DataModule, reloaded with `load_from_checkpoint` after fit (the
style of Lightning's autoencoder and DataModule tutorials).

Lightning original imports: ``import lightning as L`` and ``from lightning.pytorch.callbacks import
ModelCheckpoint``. Only those lines changed.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset, random_split

from callbacks import ModelCheckpoint
from trainer import DataModule, Task, Trainer, seed_everything


class DigitsDataModule(DataModule):
    def __init__(self, data_dir: str = "./data", batch_size: int = 64, val_size: int = 256) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.data_file = os.path.join(data_dir, "digits.pt")

    def prepare_data(self) -> None:
        # "download" once: the bundled scikit-learn digits, scaled to [0, 1], written to data_dir
        if not os.path.exists(self.data_file):
            from sklearn.datasets import load_digits

            digits = load_digits()
            os.makedirs(self.hparams.data_dir, exist_ok=True)
            x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
            torch.save({"x": x, "y": torch.tensor(digits.target)}, self.data_file)

    def setup(self, stage: str) -> None:
        data = torch.load(self.data_file)
        full = TensorDataset(data["x"], data["y"])
        n_test = 400
        trainval, self.digits_test = random_split(
            full, [len(full) - n_test, n_test], generator=torch.Generator().manual_seed(42)
        )
        n_val = self.hparams.val_size
        self.digits_train, self.digits_val = random_split(
            trainval, [len(trainval) - n_val, n_val], generator=torch.Generator().manual_seed(42)
        )

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.digits_train, batch_size=self.hparams.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.digits_val, batch_size=self.hparams.batch_size)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.digits_test, batch_size=self.hparams.batch_size)

    def predict_dataloader(self) -> DataLoader:
        return DataLoader(self.digits_test, batch_size=self.hparams.batch_size)


class AutoEncoder(Task):
    def __init__(self, hidden_dim: int = 32, latent_dim: int = 6, lr: float = 3e-3) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.encoder = nn.Sequential(nn.Linear(64, hidden_dim), nn.ReLU(), nn.Linear(hidden_dim, latent_dim))
        self.decoder = nn.Sequential(nn.Linear(latent_dim, hidden_dim), nn.ReLU(), nn.Linear(hidden_dim, 64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x)  # the embedding, as in the tutorial

    def _loss(self, batch: Any) -> torch.Tensor:
        x, _ = batch
        return F.mse_loss(self.decoder(self.encoder(x)), x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = self._loss(batch)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", self._loss(batch), prog_bar=True)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self.log("test_loss", self._loss(batch))

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> torch.Tensor:
        return self(batch[0])

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


def main(data_dir: str = "./data", **overrides: Any) -> dict[str, Any]:
    seed_everything(7)
    dm = DigitsDataModule(data_dir=data_dir, batch_size=64)
    model = AutoEncoder()
    checkpoint = ModelCheckpoint(monitor="val_loss", save_top_k=1, mode="min")
    options: dict[str, Any] = dict(max_epochs=4, accelerator="auto", devices=1)
    options.update(overrides)
    callbacks = [checkpoint, *options.pop("callbacks", [])]
    trainer = Trainer(callbacks=callbacks, **options)
    trainer.fit(model, datamodule=dm)

    # reload the best weights with a smaller learning rate for a later fine-tuning run
    best = AutoEncoder.load_from_checkpoint(checkpoint.best_model_path, lr=1e-4)
    results = trainer.test(best, datamodule=dm)
    embeddings = trainer.predict(best, datamodule=dm)
    return {"model": model, "best": best, "trainer": trainer, "results": results, "embeddings": embeddings}


if __name__ == "__main__":
    main()
