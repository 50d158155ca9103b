"""A project-template style module: the network and optimizer are injected (as a config system would build
them), torchmetrics objects are logged, the best checkpoint is tested at the end.

Lightning original imports: ``from lightning import LightningDataModule, LightningModule, Trainer``,
``from lightning.pytorch.callbacks import ...``, ``from lightning.pytorch.loggers import CSVLogger``.
Only those lines changed.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset, random_split
from torchmetrics import MaxMetric, MeanMetric
from torchmetrics.classification.accuracy import Accuracy

from callbacks import EarlyStopping, ModelCheckpoint, TQDMProgressBar
from trainer import DataModule, Task, Trainer, seed_everything
from trainer.loggers import CSVLogger


class SimpleDenseNet(nn.Module):
    def __init__(
        self, input_size: int = 64, lin1_size: int = 64, lin2_size: int = 32, output_size: int = 10
    ) -> None:
        super().__init__()
        self.model = nn.Sequential(
            nn.Linear(input_size, lin1_size), nn.BatchNorm1d(lin1_size), nn.ReLU(),
            nn.Linear(lin1_size, lin2_size), nn.BatchNorm1d(lin2_size), nn.ReLU(),
            nn.Linear(lin2_size, output_size),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x.view(x.size(0), -1))


class DigitsDataModule(DataModule):
    def __init__(
        self, train_val_test_split: tuple[int, int, int] = (1197, 300, 300), batch_size: int = 64,
        num_workers: int = 0, pin_memory: bool = False,
    ) -> None:  # fmt: skip
        super().__init__()
        self.save_hyperparameters(logger=False)
        self.data_train: Dataset | None = None
        self.data_val: Dataset | None = None
        self.data_test: Dataset | None = None
        self.batch_size_per_device = batch_size

    @property
    def num_classes(self) -> int:
        return 10

    def setup(self, stage: str | None = None) -> None:
        # divide the batch size by the number of devices
        if self.trainer is not None:
            if self.hparams.batch_size % self.trainer.world_size != 0:
                raise RuntimeError(
                    f"Batch size ({self.hparams.batch_size}) is not divisible by the number of devices ({self.trainer.world_size})."
                )
            self.batch_size_per_device = self.hparams.batch_size // self.trainer.world_size
        if not self.data_train and not self.data_val and not self.data_test:
            from sklearn.datasets import load_digits

            digits = load_digits()
            dataset = TensorDataset(
                torch.tensor(digits.data, dtype=torch.float32) / 16.0, torch.tensor(digits.target)
            )
            self.data_train, self.data_val, self.data_test = random_split(
                dataset,
                lengths=self.hparams.train_val_test_split,
                generator=torch.Generator().manual_seed(42),
            )

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.data_train, batch_size=self.batch_size_per_device, shuffle=True,
                          num_workers=self.hparams.num_workers, pin_memory=self.hparams.pin_memory)  # fmt: skip

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.data_val, batch_size=self.batch_size_per_device, shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.data_test, batch_size=self.batch_size_per_device, shuffle=False)


class DigitsLitModule(Task):
    def __init__(
        self, net: nn.Module, optimizer: functools.partial, scheduler: functools.partial | None, compile: bool
    ) -> None:
        super().__init__()
        # also makes the init params available as self.hparams; the network is a module, not a setting
        self.save_hyperparameters(logger=False, ignore=["net"])
        self.net = net
        self.criterion = nn.CrossEntropyLoss()
        self.train_acc = Accuracy(task="multiclass", num_classes=10)
        self.val_acc = Accuracy(task="multiclass", num_classes=10)
        self.test_acc = Accuracy(task="multiclass", num_classes=10)
        self.train_loss, self.val_loss, self.test_loss = MeanMetric(), MeanMetric(), MeanMetric()
        self.val_acc_best = MaxMetric()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def on_train_start(self) -> None:
        # the sanity check updated these: start the run from a clean slate
        self.val_loss.reset()
        self.val_acc.reset()
        self.val_acc_best.reset()

    def model_step(self, batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        x, y = batch
        logits = self.forward(x)
        loss = self.criterion(logits, y)
        return loss, torch.argmax(logits, dim=1), y

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss, preds, targets = self.model_step(batch)
        self.train_loss(loss)
        self.train_acc(preds, targets)
        self.log("train/loss", self.train_loss, on_step=False, on_epoch=True, prog_bar=True)
        self.log("train/acc", self.train_acc, on_step=False, on_epoch=True, prog_bar=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        loss, preds, targets = self.model_step(batch)
        self.val_loss(loss)
        self.val_acc(preds, targets)
        self.log("val/loss", self.val_loss, on_step=False, on_epoch=True, prog_bar=True)
        self.log("val/acc", self.val_acc, on_step=False, on_epoch=True, prog_bar=True)

    def on_validation_epoch_end(self) -> None:
        acc = self.val_acc.compute()
        self.val_acc_best(acc)
        self.log("val/acc_best", self.val_acc_best.compute(), sync_dist=True, prog_bar=True)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        loss, preds, targets = self.model_step(batch)
        self.test_loss(loss)
        self.test_acc(preds, targets)
        self.log("test/loss", self.test_loss, on_step=False, on_epoch=True, prog_bar=True)
        self.log("test/acc", self.test_acc, on_step=False, on_epoch=True, prog_bar=True)

    def setup(self, stage: str) -> None:
        if self.hparams.compile and stage == "fit":
            self.net = torch.compile(self.net)

    def configure_optimizers(self) -> dict[str, Any]:
        optimizer = self.hparams.optimizer(params=self.trainer.model.parameters())
        if self.hparams.scheduler is not None:
            scheduler = self.hparams.scheduler(optimizer=optimizer)
            return {
                "optimizer": optimizer,
                "lr_scheduler": {
                    "scheduler": scheduler,
                    "monitor": "val/loss",
                    "interval": "epoch",
                    "frequency": 1,
                },
            }
        return {"optimizer": optimizer}


def main(**overrides: Any) -> dict[str, Any]:
    seed_everything(12345, workers=True)
    datamodule = DigitsDataModule(batch_size=64)
    net = SimpleDenseNet()
    model = DigitsLitModule(
        net=net,
        optimizer=functools.partial(torch.optim.Adam, lr=0.01, weight_decay=0.0),
        scheduler=functools.partial(
            torch.optim.lr_scheduler.ReduceLROnPlateau, mode="min", factor=0.5, patience=0, threshold=0.3
        ),
        compile=False,
    )
    root = overrides.pop("default_root_dir", ".")
    callbacks = [
        ModelCheckpoint(
            monitor="val/acc",
            mode="max",
            save_last=True,
            filename="epoch_{epoch:03d}",
            auto_insert_metric_name=False,
        ),  # fmt: skip
        EarlyStopping(monitor="val/acc", patience=100, mode="max"),
        TQDMProgressBar(refresh_rate=20),
        *overrides.pop("callbacks", []),
    ]
    options: dict[str, Any] = dict(
        min_epochs=1, max_epochs=5, accelerator="cpu", devices=1, deterministic=False
    )
    options.update(overrides)
    trainer = Trainer(
        default_root_dir=root, callbacks=callbacks, logger=CSVLogger(save_dir=root, name="csv"), **options
    )
    trainer.fit(model=model, datamodule=datamodule)
    train_metrics = dict(trainer.callback_metrics)

    ckpt_path = trainer.checkpoint_callback.best_model_path
    test_results = trainer.test(model=model, datamodule=datamodule, ckpt_path="best", verbose=False)
    test_metrics = dict(trainer.callback_metrics)
    return {"model": model, "trainer": trainer, "train_metrics": train_metrics, "test_metrics": test_metrics,
            "test_results": test_results, "ckpt_path": ckpt_path}  # fmt: skip


if __name__ == "__main__":
    main()
