"""Minimal re-creation of models/swin_transformer.py of github.com/Cogniveon/pytorch-template (commit
07da6ca94fab3a64bc77009786b2a9f990a2e164): the same class name, __init__ arguments, logged keys and
configure_optimizers, on Tandem's Task (the import changed, as when porting), with a linear head on 3x8x8
images in place of torchvision's pretrained swin_v2_b (a download) and a plain accuracy in place of torchmetrics."""

import torch
import torch.nn as nn

from trainer import Task


class SwinTransformer(Task):
    def __init__(self, num_classes: int = 10, learning_rate: float = 1e-3):
        super().__init__()
        self.model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, num_classes))
        self.learning_rate = learning_rate
        self.save_hyperparameters()

    def forward(self, x):
        return self.model(x)

    def training_step(self, batch, batch_idx):
        tensors, targets = batch
        loss = nn.functional.cross_entropy(self.model(tensors), targets)
        self.log("train/loss", loss, prog_bar=True, logger=True)
        return {"loss": loss}

    def validation_step(self, batch, batch_idx):
        tensors, targets = batch
        outputs = self.model(tensors)
        self.log("val/loss", nn.functional.cross_entropy(outputs, targets), logger=True)
        self.log("val/acc", (outputs.argmax(1) == targets).float().mean(), on_epoch=True, prog_bar=True)

    def configure_optimizers(self):
        optimizer = torch.optim.Adam(self.model.parameters(), lr=self.learning_rate)
        lr_scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
        return [optimizer], [lr_scheduler]
