"""An ImageNet-example style classifier: a small convolutional net with BatchNorm, top-1/top-5 accuracy,
SGD with a step decay, `benchmark=True` and `sync_batchnorm=True`, and a global validation accuracy that
gathers counts from every process when the strategy is a ParallelStrategy. Data: the 8x8 digits as images.

Lightning original imports: ``import lightning as L``, ``from lightning.pytorch.strategies import
ParallelStrategy``, ``from lightning.pytorch.utilities import rank_zero_only``. Only those lines changed.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from strategies import ParallelStrategy
from trainer import Task, Trainer, rank_zero_only, seed_everything


def digit_images(start: int, stop: int) -> TensorDataset:
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = torch.tensor(digits.images[start:stop], dtype=torch.float32).unsqueeze(1) / 16.0
    x = (x - 0.3) / 0.35  # the per-channel normalisation of an ImageNet pipeline
    return TensorDataset(x, torch.tensor(digits.target[start:stop]))


def small_convnet(num_classes: int = 10) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(inplace=True),
        nn.Conv2d(8, 16, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, num_classes),
    )  # fmt: skip


class ImageNetLightningModel(Task):
    def __init__(
        self, lr: float = 0.05, momentum: float = 0.9, weight_decay: float = 1e-4, batch_size: int = 32,
        workers: int = 0,
    ) -> None:  # fmt: skip
        super().__init__()
        self.save_hyperparameters()
        self.model = small_convnet()
        self._correct = torch.zeros(())
        self._seen = torch.zeros(())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        images, target = batch
        output = self.model(images)
        loss_train = F.cross_entropy(output, target)
        acc1, acc5 = self.__accuracy(output, target, topk=(1, 5))
        self.log("train_loss", loss_train)
        self.log("train_acc1", acc1, prog_bar=True)
        self.log("train_acc5", acc5)
        return loss_train

    def eval_step(self, batch: Any, batch_idx: int, prefix: str) -> torch.Tensor:
        images, target = batch
        output = self.model(images)
        loss_val = F.cross_entropy(output, target)
        acc1, acc5 = self.__accuracy(output, target, topk=(1, 5))
        self.log(f"{prefix}_loss", loss_val, on_step=True, on_epoch=True)
        self.log(f"{prefix}_acc1", acc1, on_step=True, prog_bar=True, on_epoch=True)
        self.log(f"{prefix}_acc5", acc5, on_step=True, on_epoch=True)
        self._correct = self._correct + (output.argmax(1) == target).sum()
        self._seen = self._seen + len(target)
        return loss_val

    def validation_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.eval_step(batch, batch_idx, "val")

    def on_validation_epoch_start(self) -> None:
        self._correct, self._seen = torch.zeros((), device=self.device), torch.zeros((), device=self.device)

    def on_validation_epoch_end(self) -> None:
        correct, seen = self._correct, self._seen
        if isinstance(self.trainer.strategy, ParallelStrategy):
            # every process saw a different shard: add up the counts of all of them
            correct, seen = self.all_gather(correct).sum(), self.all_gather(seen).sum()
        self.log("val_acc_global", correct / seen)
        self.val_samples_seen = int(seen)

    @staticmethod
    def __accuracy(
        output: torch.Tensor, target: torch.Tensor, topk: tuple[int, ...] = (1,)
    ) -> list[torch.Tensor]:
        """Computes the accuracy over the k top predictions for the specified values of k."""
        with torch.no_grad():
            maxk = max(topk)
            batch_size = target.size(0)
            _, pred = output.topk(maxk, 1, True, True)
            pred = pred.t()
            correct = pred.eq(target.view(1, -1).expand_as(pred))
            res = []
            for k in topk:
                correct_k = correct[:k].reshape(-1).float().sum(0, keepdim=True)
                res.append(correct_k.mul_(100.0 / batch_size))
            return res

    def configure_optimizers(self) -> Any:
        # linear scaling rule: the global batch grows with the number of processes
        world_size = (
            self.trainer.strategy.world_size if isinstance(self.trainer.strategy, ParallelStrategy) else 1
        )
        optimizer = torch.optim.SGD(
            self.parameters(), lr=self.hparams.lr * world_size, momentum=self.hparams.momentum,
            weight_decay=self.hparams.weight_decay,
        )  # fmt: skip
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda epoch: 0.1 ** (epoch // 2))
        return [optimizer], [scheduler]

    def train_dataloader(self) -> DataLoader:
        return DataLoader(digit_images(0, 1024), batch_size=self.hparams.batch_size, shuffle=True,
                          num_workers=self.hparams.workers)  # fmt: skip

    def val_dataloader(self) -> DataLoader:
        return DataLoader(digit_images(1024, 1280), batch_size=self.hparams.batch_size, shuffle=False,
                          num_workers=self.hparams.workers)  # fmt: skip


@rank_zero_only
def report(trainer: Trainer, model: ImageNetLightningModel) -> None:
    print(
        f"global val acc {float(trainer.callback_metrics['val_acc_global']):.3f} over {model.val_samples_seen} images"
    )


def main(**overrides: Any) -> dict[str, Any]:
    seed_everything(0)
    model = ImageNetLightningModel()
    options: dict[str, Any] = dict(
        max_epochs=3, accelerator="auto", devices=1, strategy="auto", benchmark=True, sync_batchnorm=True,
        logger=False,
    )  # fmt: skip
    options.update(overrides)
    trainer = Trainer(**options)
    trainer.fit(model)
    report(trainer, model)
    return {"model": model, "trainer": trainer}


if __name__ == "__main__":
    main()
