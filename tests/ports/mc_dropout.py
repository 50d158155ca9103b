"""A regressor with Monte-Carlo dropout: the network is built in `configure_model`, validation and prediction
keep dropout active (`on_validation_model_eval`/`on_validation_model_train`, `on_predict_model_eval`) and
average several stochastic passes; validate/test/predict are called with `model=` after fit. The style of
Lightning's documentation examples for these hooks.

Lightning original import: ``import lightning as L``. Only that line changed.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainer import Task, Trainer, seed_everything


def noisy_sine(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 1, generator=g) * 6 - 3
    return TensorDataset(x, torch.sin(x) + 0.1 * torch.randn(n, 1, generator=g))


def enable_dropout(module: nn.Module) -> None:
    for m in module.modules():
        if isinstance(m, nn.Dropout):
            m.train()


class MCDropoutRegressor(Task):
    def __init__(self, hidden: int = 32, p: float = 0.2, lr: float = 0.01, mc_samples: int = 4) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net: nn.Module | None = None

    def configure_model(self) -> None:
        if self.net is not None:  # called for every stage: build once
            return
        h, p = self.hparams.hidden, self.hparams.p
        self.net = nn.Sequential(nn.Linear(1, h), nn.Tanh(), nn.Dropout(p), nn.Linear(h, h), nn.Tanh(), nn.Dropout(p),
                                 nn.Linear(h, 1))  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def mc_predict(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        samples = torch.stack([self(x) for _ in range(self.hparams.mc_samples)])
        return samples.mean(0), samples.std(0)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.mse_loss(self(x), y)
        self.log("train_loss", loss)
        return loss

    def on_validation_model_eval(self) -> None:
        self.eval()
        enable_dropout(self)  # score the MC-dropout predictive mean, not the deterministic net

    def on_validation_model_train(self) -> None:
        self.train()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        mean, _ = self.mc_predict(x)
        self.log("val_mse", F.mse_loss(mean, y), prog_bar=True)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("test_mse", F.mse_loss(self(x), y))  # the deterministic net (plain eval mode)

    def on_predict_model_eval(self) -> None:
        self.eval()
        enable_dropout(self)

    def predict_step(
        self, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.mc_predict(batch[0])

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


def main(**overrides: Any) -> dict[str, Any]:
    seed_everything(21)
    train = DataLoader(noisy_sine(256, seed=0), batch_size=32, shuffle=True)
    val = DataLoader(noisy_sine(64, seed=1), batch_size=32)
    model = MCDropoutRegressor()
    options: dict[str, Any] = dict(max_epochs=4, accelerator="auto", devices=1)
    options.update(overrides)
    trainer = Trainer(**options)
    trainer.fit(model=model, train_dataloaders=train, val_dataloaders=val)
    val_results = trainer.validate(model=model, dataloaders=val, verbose=False)
    test_results = trainer.test(model=model, dataloaders=val, verbose=False)
    predictions = trainer.predict(model=model, dataloaders=DataLoader(noisy_sine(16, seed=2), batch_size=8))
    return {
        "model": model,
        "trainer": trainer,
        "val": val_results,
        "test": test_results,
        "predictions": predictions,
    }


if __name__ == "__main__":
    main()
