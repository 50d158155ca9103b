"""A small regression Task and data set shared by the loop tests, and a weight comparison."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from trainer import Task


def dataset(n: int = 20) -> TensorDataset:
    g = torch.Generator().manual_seed(1234)
    return TensorDataset(torch.randn(n, 4, generator=g), torch.randn(n, 1, generator=g))


def make_net(dropout: float = 0.3) -> nn.Module:
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Dropout(dropout), nn.Linear(8, 1))


def make_optim(params, scheduler: str | None):
    opt = torch.optim.SGD(params, lr=0.1, momentum=0.9)
    if scheduler == "epoch":
        return opt, torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    if scheduler == "step":
        return opt, torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.8)
    return opt, None


class Regressor(Task):
    def __init__(self, dropout: float = 0.3, scheduler: str | None = None, frequency: int = 1) -> None:
        super().__init__()
        self.net = make_net(dropout)
        self.scheduler, self.frequency = scheduler, frequency
        self.losses: list[float] = []
        self.grads: list[list[torch.Tensor]] = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self.net(x), y)
        self.losses.append(loss.item())
        return loss

    def on_before_optimizer_step(self, optimizer):
        self.grads.append([None if p.grad is None else p.grad.clone() for p in self.net.parameters()])

    def configure_optimizers(self):
        opt, sched = make_optim(self.parameters(), self.scheduler)
        if sched is None:
            return opt
        interval = "step" if self.scheduler == "step" else "epoch"
        return {
            "optimizer": opt,
            "lr_scheduler": {"scheduler": sched, "interval": interval, "frequency": self.frequency},
        }


def assert_same_weights(a: nn.Module, b: nn.Module, exact: bool = True) -> None:
    """Same state_dict keys in order and equal tensors (bit for bit, or within 1e-6)."""
    for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert ka == kb
        if exact:
            assert torch.equal(va, vb), ka
        else:
            torch.testing.assert_close(va, vb, rtol=1e-6, atol=1e-6)
