"""The MLP task and data of the DataParallel tests, and gradient/state comparisons."""

from __future__ import annotations

import threading

import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

from trainer import Task

CPU = torch.device("cpu")


def make_data(n: int = 50, seed: int = 0) -> TensorDataset:
    """n samples of 6 features with labels in 0..2."""
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g))


class MLP(Task):
    """An MLP with (disabled) dropout and, optionally, a BatchNorm kept in eval mode."""

    def __init__(self, batchnorm: bool = False, lr: float = 0.1) -> None:
        super().__init__()
        torch.manual_seed(1)
        layers = [torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Dropout(0.0)]
        if batchnorm:
            layers.insert(1, torch.nn.BatchNorm1d(16))
        self.net = torch.nn.Sequential(*layers, torch.nn.Linear(16, 3))
        self.batchnorm, self.lr = batchnorm, lr
        self.seen: list[tuple[int, str]] = []  # (chunk size, thread name) of every training_step call
        if batchnorm:  # non-trivial running statistics, so that eval-mode BatchNorm matters
            self.net[1].running_mean.uniform_(-0.5, 0.5)
            self.net[1].running_var.uniform_(0.5, 2.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def on_train_epoch_start(self) -> None:
        if self.batchnorm:
            self.net[1].eval()

    def training_step(self, batch, batch_idx):
        x, y = batch
        self.seen.append((len(x), threading.current_thread().name))
        loss = F.cross_entropy(self(x), y)
        self.log("train/loss", loss, on_step=True, on_epoch=True)
        self.log("train/n", float(len(x)), reduce_fx="sum", on_step=False, on_epoch=True)
        self.log("train/max_x", x.max(), reduce_fx="max", on_epoch=True)
        return {"loss": loss, "logits": self(x).detach()}

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.log("val/loss", F.cross_entropy(logits, y))
        self.log("val/acc", (logits.argmax(1) == y).float().mean())

    def predict_step(self, batch, batch_idx):
        return self(batch[0]).softmax(-1)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


def grads_of(task: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A copy of every parameter's gradient, by name."""
    return {n: p.grad.clone() for n, p in task.named_parameters()}


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float = 1e-6) -> None:
    """The same keys and tensors within atol."""
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=atol, rtol=0, msg=lambda m, k=k: f"{k}: {m}")
