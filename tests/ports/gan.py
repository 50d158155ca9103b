"""A GAN on 2-D points, trained with manual optimization (the style of Lightning's basic GAN example).

Lightning original imports: ``import lightning as L`` / ``L.LightningModule``, ``L.LightningDataModule``,
``L.Trainer``, ``L.seed_everything``. Only those lines changed.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from trainer import DataModule, Task, Trainer, seed_everything


def ring_points(n: int = 384, modes: int = 6, seed: int = 3) -> torch.Tensor:
    """Points around `modes` centres on the unit circle (a classic GAN toy distribution)."""
    g = torch.Generator().manual_seed(seed)
    centre = torch.randint(0, modes, (n,), generator=g).float() * (2 * math.pi / modes)
    ring = torch.stack([torch.cos(centre), torch.sin(centre)], dim=1)
    return ring + 0.05 * torch.randn(n, 2, generator=g)


class RingDataModule(DataModule):
    def __init__(self, batch_size: int = 64, n: int = 384) -> None:
        super().__init__()
        self.save_hyperparameters()

    def setup(self, stage: str) -> None:
        points = ring_points(self.hparams.n)
        self.train_set = TensorDataset(points[: self.hparams.n - 64])
        self.val_set = TensorDataset(points[self.hparams.n - 64 :])

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.hparams.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        # the data module is shared with other experiments; this GAN has no validation_step
        return DataLoader(self.val_set, batch_size=self.hparams.batch_size)


class Generator(nn.Module):
    def __init__(self, latent_dim: int = 4, hidden: int = 32) -> None:
        super().__init__()
        self.model = nn.Sequential(
            nn.Linear(latent_dim, hidden), nn.LeakyReLU(0.2), nn.Linear(hidden, hidden), nn.LeakyReLU(0.2),
            nn.Linear(hidden, 2),
        )  # fmt: skip

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.model(z)


class Discriminator(nn.Module):
    def __init__(self, hidden: int = 32) -> None:
        super().__init__()
        self.model = nn.Sequential(nn.Linear(2, hidden), nn.LeakyReLU(0.2), nn.Linear(hidden, 1))

    def forward(self, points: torch.Tensor) -> torch.Tensor:
        return self.model(points)


class GAN(Task):
    def __init__(self, latent_dim: int = 4, lr: float = 2e-3, b1: float = 0.5, b2: float = 0.999) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.generator = Generator(latent_dim)
        self.discriminator = Discriminator()
        self.validation_z = torch.randn(16, latent_dim)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.generator(z)

    def adversarial_loss(self, y_hat: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.binary_cross_entropy_with_logits(y_hat, y)

    def training_step(self, batch: Any) -> None:
        (points,) = batch
        optimizer_g, optimizer_d = self.optimizers()
        z = torch.randn(points.shape[0], self.hparams.latent_dim).type_as(points)

        # train the generator: make the discriminator call its samples real
        self.toggle_optimizer(optimizer_g)
        valid = torch.ones(points.size(0), 1).type_as(points)
        g_loss = self.adversarial_loss(self.discriminator(self(z)), valid)
        self.log("g_loss", g_loss, prog_bar=True)
        self.manual_backward(g_loss)
        optimizer_g.step()
        optimizer_g.zero_grad()
        self.untoggle_optimizer(optimizer_g)

        # train the discriminator: tell real points from generated ones
        self.toggle_optimizer(optimizer_d)
        fake = torch.zeros(points.size(0), 1).type_as(points)
        real_loss = self.adversarial_loss(self.discriminator(points), valid)
        fake_loss = self.adversarial_loss(self.discriminator(self(z).detach()), fake)
        d_loss = (real_loss + fake_loss) / 2
        self.log("d_loss", d_loss, prog_bar=True)
        self.manual_backward(d_loss)
        optimizer_d.step()
        optimizer_d.zero_grad()
        self.untoggle_optimizer(optimizer_d)

    def configure_optimizers(self) -> Any:
        lr, b1, b2 = self.hparams.lr, self.hparams.b1, self.hparams.b2
        opt_g = torch.optim.Adam(self.generator.parameters(), lr=lr, betas=(b1, b2))
        opt_d = torch.optim.Adam(self.discriminator.parameters(), lr=lr, betas=(b1, b2))
        return [opt_g, opt_d], []

    def on_train_epoch_end(self) -> None:
        with torch.no_grad():
            sample = self(self.validation_z.type_as(self.generator.model[0].weight))
        self.log("sample_radius", sample.norm(dim=1).mean())


def main(**overrides: Any) -> dict[str, Any]:
    seed_everything(42)
    dm = RingDataModule()
    model = GAN()
    options: dict[str, Any] = dict(accelerator="auto", devices=1, max_epochs=3)
    options.update(overrides)
    trainer = Trainer(**options)
    trainer.fit(model, dm)
    return {"model": model, "trainer": trainer}


if __name__ == "__main__":
    main()
