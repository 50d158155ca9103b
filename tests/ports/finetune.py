"""Fine-tuning a "pretrained" backbone with a new head: the backbone is frozen for the first epoch, trained
with a smaller learning rate afterwards; gradients are clipped only once it trains; a timm-like scheduler is
stepped through `lr_scheduler_step`; the model brings its own callbacks (`configure_callbacks`) and zeroes
gradients its own way (`optimizer_zero_grad`). The style of Lightning's transfer-learning examples.

Lightning original imports: ``import lightning as L``, ``from lightning.pytorch.callbacks import
EarlyStopping, ModelCheckpoint``. Only those lines changed.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from callbacks import EarlyStopping, ModelCheckpoint
from trainer import Task, Trainer, seed_everything


def digits(start: int, stop: int) -> TensorDataset:
    from sklearn.datasets import load_digits

    d = load_digits()
    return TensorDataset(
        torch.tensor(d.data[start:stop], dtype=torch.float32) / 16.0, torch.tensor(d.target[start:stop])
    )


class EpochDecay:
    """A scheduler with a timm-like interface (not a torch LRScheduler): step(epoch) sets the rate that the
    epoch after `epoch` uses."""

    def __init__(
        self, optimizer: torch.optim.Optimizer, decay_rate: float = 0.5, decay_epochs: int = 2
    ) -> None:
        self.optimizer = optimizer
        self.decay_rate, self.decay_epochs = decay_rate, decay_epochs
        self.base_lrs = [group["lr"] for group in optimizer.param_groups]

    def step(self, epoch: int) -> None:
        factor = self.decay_rate ** ((epoch + 1) // self.decay_epochs)
        for group, base in zip(self.optimizer.param_groups, self.base_lrs):
            group["lr"] = base * factor

    def state_dict(self) -> dict[str, Any]:
        return {"base_lrs": self.base_lrs, "decay_rate": self.decay_rate, "decay_epochs": self.decay_epochs}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)


class FineTuner(Task):
    def __init__(self, lr: float = 0.5, backbone_lr_factor: float = 0.1, unfreeze_at_epoch: int = 1) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.backbone = nn.Sequential(nn.Linear(64, 48), nn.ReLU(), nn.Linear(48, 32), nn.ReLU())
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))

    def on_train_epoch_start(self) -> None:
        # keep the pretrained features fixed while the new head settles
        frozen = self.current_epoch < self.hparams.unfreeze_at_epoch
        for p in self.backbone.parameters():
            p.requires_grad = not frozen

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        logits = self(x)
        self.log("val_loss", F.cross_entropy(logits, y), prog_bar=True)
        self.log("val_acc", (logits.argmax(1) == y).float().mean())

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(
            [
                {
                    "params": self.backbone.parameters(),
                    "lr": self.hparams.lr * self.hparams.backbone_lr_factor,
                },
                {"params": self.head.parameters()},
            ],
            lr=self.hparams.lr,
            momentum=0.9,
        )
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": EpochDecay(optimizer), "interval": "epoch"},
        }

    def lr_scheduler_step(self, scheduler: Any, metric: Any) -> None:
        scheduler.step(epoch=self.current_epoch)  # this scheduler wants the epoch

    def configure_gradient_clipping(
        self,
        optimizer: Any,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        # the head alone trains smoothly; clip once the backbone's larger gradients join in
        if self.current_epoch >= self.hparams.unfreeze_at_epoch:
            self.clip_gradients(
                optimizer,
                gradient_clip_val=gradient_clip_val,
                gradient_clip_algorithm=gradient_clip_algorithm,
            )

    def optimizer_zero_grad(self, epoch: int, batch_idx: int, optimizer: Any) -> None:
        optimizer.zero_grad(set_to_none=False)  # keep the gradient buffers allocated between steps

    def configure_callbacks(self) -> list[Any]:
        early_stop = EarlyStopping(monitor="val_loss", mode="min", patience=2)
        checkpoint = ModelCheckpoint(monitor="val_loss", filename="{epoch:02d}-{val_loss:.2f}")
        return [early_stop, checkpoint]


def main(**overrides: Any) -> dict[str, Any]:
    seed_everything(3)
    model = FineTuner()
    train = DataLoader(digits(0, 1024), batch_size=64, shuffle=True)
    val = DataLoader(digits(1024, 1536), batch_size=128)
    options: dict[str, Any] = dict(
        max_epochs=6, accumulate_grad_batches=2, gradient_clip_val=0.2, accelerator="auto"
    )
    options.update(overrides)
    trainer = Trainer(**options)
    trainer.fit(model, train_dataloaders=train, val_dataloaders=val)
    return {"model": model, "trainer": trainer}


if __name__ == "__main__":
    main()
