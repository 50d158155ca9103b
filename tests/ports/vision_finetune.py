"""Lightning's examples/pytorch/domain_templates/computer_vision_fine_tuning.py (Lightning 2.6): a
``MilestonesFinetuning`` (BaseFinetuning) callback that keeps the feature extractor frozen (batch norm too,
``train_bn=False``), unfreezes its last 5 layers at the first milestone and the rest at the second, each into a
new Adam parameter group; ``configure_optimizers`` takes only the trainable parameters, with a MultiStepLR.

Lightning original imports: ``from lightning.pytorch import LightningDataModule, LightningModule``,
``from lightning.pytorch.callbacks.finetuning import BaseFinetuning``, ``from lightning.pytorch.utilities import
rank_zero_info``. Changed besides those lines: the cats-and-dogs download and the pretrained ResNet-50 are the 8x8
digits (is it a 0-4?) and a small convolutional feature extractor (9 layers, batch norm included); the
LightningCLI entry point is a ``main()`` with the CLI's defaults (max_epochs 15 there, 6 here;
enable_model_summary=False, num_sanity_val_steps=0, seed 1234).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn, optim
from torch.optim.lr_scheduler import MultiStepLR
from torch.optim.optimizer import Optimizer
from torch.utils.data import DataLoader, TensorDataset

from callbacks import BaseFinetuning
from trainer import DataModule, Task, Trainer, rank_zero_only, seed_everything

log = logging.getLogger(__name__)


#  --- Finetuning Callback ---


class MilestonesFinetuning(BaseFinetuning):
    def __init__(self, milestones: tuple = (5, 10), train_bn: bool = False):
        super().__init__()
        self.milestones = milestones
        self.train_bn = train_bn

    def freeze_before_training(self, pl_module: Task):
        self.freeze(modules=pl_module.feature_extractor, train_bn=self.train_bn)

    def finetune_function(self, pl_module: Task, epoch: int, optimizer: Optimizer):
        if epoch == self.milestones[0]:
            # unfreeze 5 last layers
            self.unfreeze_and_add_param_group(
                modules=pl_module.feature_extractor[-5:], optimizer=optimizer, train_bn=self.train_bn
            )

        elif epoch == self.milestones[1]:
            # unfreeze remaining layers
            self.unfreeze_and_add_param_group(
                modules=pl_module.feature_extractor[:-5], optimizer=optimizer, train_bn=self.train_bn
            )


def digit_images(start: int, stop: int) -> TensorDataset:
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.images[start:stop], dtype=torch.float32).unsqueeze(1) / 16.0
    return TensorDataset(x, (torch.tensor(d.target[start:stop]) < 5).long())


class DigitsImageDataModule(DataModule):
    def __init__(self, num_workers: int = 0, batch_size: int = 8):
        super().__init__()
        self._num_workers = num_workers
        self._batch_size = batch_size

    def __dataloader(self, train: bool):
        """Train/validation loaders."""
        dataset = digit_images(0, 512) if train else digit_images(1024, 1280)
        return DataLoader(
            dataset=dataset, batch_size=self._batch_size, num_workers=self._num_workers, shuffle=train
        )

    def train_dataloader(self):
        log.info("Training data loaded.")
        return self.__dataloader(train=True)

    def val_dataloader(self):
        log.info("Validation data loaded.")
        return self.__dataloader(train=False)


def feature_extractor() -> nn.Sequential:
    """Stands in for ResNet-50 without its head: conv blocks with batch norm, pooled to a vector."""
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
    )  # fmt: skip


#  --- Lightning module ---


class TransferLearningModel(Task):
    def __init__(
        self,
        train_bn: bool = False,
        milestones: tuple = (2, 4),
        batch_size: int = 32,
        lr: float = 1e-3,
        lr_scheduler_gamma: float = 1e-1,
        num_workers: int = 0,
        **kwargs,
    ) -> None:
        super().__init__()
        self.train_bn = train_bn
        self.milestones = milestones
        self.batch_size = batch_size
        self.lr = lr
        self.lr_scheduler_gamma = lr_scheduler_gamma
        self.num_workers = num_workers

        self.__build_model()
        self.save_hyperparameters()

    def __build_model(self):
        """Define model layers & loss."""
        # 1. Load pre-trained network:
        self.feature_extractor = feature_extractor()

        # 2. Classifier:
        _fc_layers = [nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 8), nn.Linear(8, 1)]
        self.fc = nn.Sequential(*_fc_layers)

        # 3. Loss:
        self.loss_func = F.binary_cross_entropy_with_logits

    def forward(self, x):
        """Forward pass.

        Returns logits.

        """
        # 1. Feature extraction:
        x = self.feature_extractor(x)
        x = x.squeeze(-1).squeeze(-1)

        # 2. Classifier (returns logits):
        return self.fc(x)

    def loss(self, logits, labels):
        return self.loss_func(input=logits, target=labels)

    def training_step(self, batch, batch_idx):
        # 1. Forward pass:
        x, y = batch
        y_logits = self.forward(x)
        y_true = y.view((-1, 1)).type_as(x)

        # 2. Compute loss
        train_loss = self.loss(y_logits, y_true)
        return train_loss

    def validation_step(self, batch, batch_idx):
        # 1. Forward pass:
        x, y = batch
        y_logits = self.forward(x)
        y_true = y.view((-1, 1)).type_as(x)

        # 2. Compute loss
        self.log("val_loss", self.loss(y_logits, y_true), prog_bar=True)

    def configure_optimizers(self):
        parameters = list(self.parameters())
        trainable_parameters = list(filter(lambda p: p.requires_grad, parameters))
        rank_zero_only(log.info)(
            f"The model will start training with only {len(trainable_parameters)} "
            f"trainable parameters out of {len(parameters)}."
        )
        optimizer = optim.Adam(trainable_parameters, lr=self.lr)
        scheduler = MultiStepLR(optimizer, milestones=self.milestones, gamma=self.lr_scheduler_gamma)
        return [optimizer], [scheduler]


def main(milestones: tuple = (2, 4), train_bn: bool = False, **trainer_kwargs: Any) -> dict[str, Any]:
    """What ``MyLightningCLI(TransferLearningModel, DigitsImageDataModule, seed_everything_default=1234)`` runs."""
    seed_everything(1234)
    model = TransferLearningModel(milestones=milestones, train_bn=train_bn)
    datamodule = DigitsImageDataModule(batch_size=model.batch_size)
    finetuning = MilestonesFinetuning(milestones=milestones, train_bn=train_bn)
    options = {"max_epochs": 6, "enable_model_summary": False, "num_sanity_val_steps": 0, **trainer_kwargs}
    trainer = Trainer(callbacks=[finetuning, *options.pop("callbacks", [])], **options)
    trainer.fit(model, datamodule=datamodule)
    return {"model": model, "trainer": trainer}


if __name__ == "__main__":
    main()
