"""A digit classifier trained with a curriculum (easy classes first, more every two epochs, with the Trainer
reloading the training loader), its own sampler (`use_distributed_sampler=False`), two loggers used from the
model (`self.logger`, `self.loggers`), the simple profiler, anomaly detection, and saliency maps computed with
gradients inside `predict_step` (`inference_mode=False`).

Lightning original imports: ``import lightning as L``, ``from lightning.pytorch.loggers import
CSVLogger, TensorBoardLogger``, ``from lightning.pytorch.strategies import ParallelStrategy``. Only those
lines changed.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler, TensorDataset

from strategies import ParallelStrategy
from trainer import Task, Trainer, seed_everything
from trainer.loggers import CSVLogger, TensorBoardLogger


def load_digits_tensors() -> tuple[torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits

    d = load_digits()
    return torch.tensor(d.data, dtype=torch.float32) / 16.0, torch.tensor(d.target)


def classes_at(epoch: int, stage_epochs: int) -> int:
    """How many digit classes (0..n-1) the curriculum shows in `epoch`."""
    return min(10, 4 + 3 * (epoch // stage_epochs))


class CurriculumClassifier(Task):
    def __init__(self, lr: float = 0.05, stage_epochs: int = 2, batch_size: int = 64) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.features = nn.Sequential(nn.Linear(64, 64), nn.ReLU())
        self.classifier = nn.Linear(64, 10)

    def setup(self, stage: str) -> None:
        x, y = load_digits_tensors()
        self.train_x, self.train_y = x[:1280], y[:1280]
        self.val_set = TensorDataset(x[1280:], y[1280:])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))

    def train_dataloader(self) -> DataLoader:
        # called again every reload_dataloaders_every_n_epochs epochs: the curriculum grows
        keep = self.train_y < classes_at(self.current_epoch, self.hparams.stage_epochs)
        dataset = TensorDataset(self.train_x[keep], self.train_y[keep])
        if isinstance(self.trainer.strategy, ParallelStrategy):
            sampler = DistributedSampler(
                dataset, num_replicas=self.trainer.world_size, rank=self.global_rank, seed=13
            )
        else:  # its own seeded generator: the shuffles depend on nothing else the run draws
            sampler = RandomSampler(dataset, generator=torch.Generator().manual_seed(13 + self.current_epoch))
        return DataLoader(dataset, batch_size=self.hparams.batch_size, sampler=sampler)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=128)

    def on_train_epoch_start(self) -> None:
        n = classes_at(self.current_epoch, self.hparams.stage_epochs)
        for logger in self.loggers:
            logger.log_metrics({"curriculum/classes": n}, step=self.global_step)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        logits = self(x)
        self.log("val_loss", F.cross_entropy(logits, y))
        self.log("val_acc", (logits.argmax(1) == y).float().mean(), prog_bar=True)

    def on_train_epoch_end(self) -> None:
        if isinstance(self.logger, TensorBoardLogger):
            self.logger.experiment.add_histogram(
                "classifier/weight", self.classifier.weight, self.current_epoch
            )

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> torch.Tensor:
        # saliency: how much each pixel moves the winning logit (needs Trainer(inference_mode=False))
        x, _ = batch
        with torch.enable_grad():
            x = x.clone().requires_grad_(True)
            (grad,) = torch.autograd.grad(self(x).max(dim=1).values.sum(), x)
        return grad.abs()

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)


def main(save_dir: str = "runs", **overrides: Any) -> dict[str, Any]:
    seed_everything(13)
    model = CurriculumClassifier()
    loggers = [TensorBoardLogger(save_dir, name="curriculum"), CSVLogger(save_dir, name="curriculum")]
    options: dict[str, Any] = dict(
        max_epochs=5, accelerator="cpu", devices="auto", logger=loggers, reload_dataloaders_every_n_epochs=2,
        use_distributed_sampler=False, profiler="simple", detect_anomaly=True, inference_mode=False,
    )  # fmt: skip
    options.update(overrides)
    trainer = Trainer(**options)
    trainer.fit(model)
    x, y = load_digits_tensors()
    saliency = trainer.predict(
        model, dataloaders=DataLoader(TensorDataset(x[1280:1312], y[1280:1312]), batch_size=16)
    )
    return {"model": model, "trainer": trainer, "saliency": saliency}


if __name__ == "__main__":
    main()
