"""The recipes of Lightning's "Effective Training Techniques" page (docs/source-pytorch/advanced/training_tricks.rst,
Lightning 2.6): a LitModel whose ``learning_rate`` and ``batch_size`` the Tuner sets (``tuner.lr_find(model)``,
``tuner.scale_batch_size(model, mode=...)``), trained with the page's ``EMAWeightAveraging`` (a WeightAveraging
that starts after a number of steps) or ``StochasticWeightAveraging(swa_epoch_start=..., swa_lrs=...)``.

Lightning original imports: ``from lightning.pytorch import LightningModule, Trainer, seed_everything``,
``from lightning.pytorch.callbacks import StochasticWeightAveraging, WeightAveraging``,
``from lightning.pytorch.tuner import Tuner``. Changed besides those lines: the page's placeholders
(``Model(...)``, ``train_dataset``) are a small classifier on the 8x8 digits, and the page's
``lr=(self.lr or self.learning_rate)`` reads ``self.learning_rate`` (the model has no ``lr``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.swa_utils import get_ema_avg_fn
from torch.utils.data import DataLoader, TensorDataset

from callbacks import StochasticWeightAveraging, WeightAveraging
from trainer import Task, Trainer, Tuner, seed_everything


def digits() -> TensorDataset:
    from sklearn.datasets import load_digits

    d = load_digits()
    return TensorDataset(
        torch.tensor(d.data[:1024], dtype=torch.float32) / 16.0, torch.tensor(d.target[:1024])
    )


class LitModel(Task):
    def __init__(self, learning_rate: float = 1e-3, batch_size: int = 32) -> None:
        super().__init__()
        self.learning_rate = learning_rate
        self.batch_size = batch_size
        self.model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.parameters(), lr=self.learning_rate)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(digits(), batch_size=self.batch_size, shuffle=True)


# Enable Exponential Moving Average after 100 steps (the page's example)
class EMAWeightAveraging(WeightAveraging):
    def __init__(self) -> None:
        super().__init__(avg_fn=get_ema_avg_fn())

    def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
        return (step_idx is not None) and (step_idx >= 100)


def main(averaging: str = "ema", tune: bool = True, **trainer_kwargs: Any) -> dict[str, Any]:
    seed_everything(1234)
    model = LitModel()
    trainer = Trainer(**{"max_epochs": 5, **trainer_kwargs})
    finder = None
    if tune:
        tuner = Tuner(trainer)
        finder = tuner.lr_find(model, min_lr=1e-5, max_lr=1.0, num_training=60)  # sets model.learning_rate
    callback = (
        EMAWeightAveraging()
        if averaging == "ema"
        else StochasticWeightAveraging(swa_epoch_start=3, swa_lrs=0.01)
    )
    trainer = Trainer(callbacks=[callback], **{"max_epochs": 5, **trainer_kwargs})
    trainer.fit(model)
    return {"model": model, "trainer": trainer, "finder": finder, "callback": callback}


if __name__ == "__main__":
    main()
