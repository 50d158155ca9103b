"""A small regression task and its data, shared by the weight-averaging, SWA, finetuning and accumulation
tests (imported by them; holds no tests)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from conftest import FAST
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainer import Task, Trainer

N, BATCH = 64, 8  # 8 batches per epoch


def dataset() -> TensorDataset:
    g = torch.Generator().manual_seed(7)
    x = torch.randn(N, 4, generator=g)
    return TensorDataset(
        x, x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1 * torch.randn(N, 1, generator=g)
    )


def loader(shuffle: bool = True) -> DataLoader:
    return DataLoader(dataset(), batch_size=BATCH, shuffle=shuffle)


def net(batch_norm: bool = False) -> nn.Sequential:
    middle = [nn.BatchNorm1d(8)] if batch_norm else []
    return nn.Sequential(nn.Linear(4, 8), *middle, nn.ReLU(), nn.Linear(8, 1))


class Regress(Task):
    """MSE regression with SGD (momentum); `backbone` and `head` so that finetuning callbacks find them."""

    def __init__(self, batch_norm: bool = False, lr: float = 0.05) -> None:
        super().__init__()
        layers = net(batch_norm)
        self.backbone, self.head = layers[:-1], layers[-1]
        self.lr = lr

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.mse_loss(self(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


def as_plain(task: Regress) -> nn.Sequential:
    """The same layers (and parameters) as one Sequential, for hand loops."""
    return nn.Sequential(*task.backbone, task.head)


def fit(task: Task, callbacks: list, epochs: int, ckpt_path: str | None = None, **options) -> Trainer:
    trainer = Trainer(max_epochs=epochs, callbacks=callbacks, **{**FAST, **options})
    trainer.fit(task, loader(), ckpt_path=ckpt_path)
    return trainer


def params(module: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.parameters()]


def state(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def assert_equal(
    a: dict[str, torch.Tensor] | list[torch.Tensor],
    b: dict[str, torch.Tensor] | list[torch.Tensor],
    atol: float = 0.0,
) -> None:
    """Equal tensors (bit for bit with atol=0)."""
    if isinstance(a, dict):
        assert sorted(a) == sorted(b), sorted(set(a) ^ set(b))
        pairs = ((a[k], b[k]) for k in a)
    else:
        assert len(a) == len(b)
        pairs = zip(a, b)
    for x, y in pairs:
        assert torch.allclose(x.double(), y.double(), rtol=0, atol=atol), float(
            (x.double() - y.double()).abs().max()
        )
