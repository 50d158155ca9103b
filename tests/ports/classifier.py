"""The shortest kind of Lightning script: a classifier with dropout, shuffled training data passed straight to
`fit`, validation and test steps (the style of Lightning's README example). Trainer defaults throughout,
so the sanity check runs two validation batches before training.

Lightning original import: ``import lightning as L``. Only that line changed.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainer import Task, Trainer, seed_everything


def digits_split() -> tuple[TensorDataset, TensorDataset, TensorDataset]:
    from sklearn.datasets import load_digits

    d = load_digits()
    x, y = torch.tensor(d.data, dtype=torch.float32) / 16.0, torch.tensor(d.target)
    return (
        TensorDataset(x[:1000], y[:1000]),
        TensorDataset(x[1000:1400], y[1000:1400]),
        TensorDataset(x[1400:], y[1400:]),
    )


class LitClassifier(Task):
    def __init__(self, hidden: int = 64, dropout: float = 0.3, lr: float = 1e-2) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.l1 = nn.Linear(64, hidden)
        self.dropout = nn.Dropout(dropout)
        self.l2 = nn.Linear(hidden, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l2(self.dropout(torch.relu(self.l1(x))))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        logits = self(x)
        self.log("val_loss", F.cross_entropy(logits, y))
        self.log("val_acc", (logits.argmax(1) == y).float().mean())

    def test_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("test_acc", (self(x).argmax(1) == y).float().mean())

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


def main(**overrides: Any) -> dict[str, Any]:
    seed_everything(1)
    train, val, test = digits_split()
    model = LitClassifier()
    options: dict[str, Any] = dict(max_epochs=3)
    options.update(overrides)
    trainer = Trainer(**options)
    trainer.fit(model, DataLoader(train, batch_size=32, shuffle=True), DataLoader(val, batch_size=100))
    results = trainer.test(model, DataLoader(test, batch_size=100))
    return {"model": model, "trainer": trainer, "results": results}


if __name__ == "__main__":
    main()
