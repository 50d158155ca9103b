"""The model, data and run helper of the checkpoint tests: a resumable run whose reads can be counted."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from conftest import FAST
from torch import nn
from torch.utils.data import DataLoader, Dataset

from trainer import Task, Trainer


class CountingData(Dataset):
    """20 samples; counts __getitem__ calls so a test can see which batches were read."""

    def __init__(self, n: int = 20) -> None:
        g = torch.Generator().manual_seed(7)
        self.x, self.y = torch.randn(n, 4, generator=g), torch.randn(n, 1, generator=g)
        self.reads = 0

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        self.reads += 1
        return self.x[i], self.y[i]


class Net(Task):
    def __init__(self, hidden: int = 8, optimizer: str = "sgd") -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(4, hidden), nn.Tanh(), nn.Dropout(0.3), nn.Linear(hidden, 1))
        self.losses: list[float] = []
        self.val_losses: list[float] = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self.net(x), y)
        self.losses.append(loss.item())
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self.net(x), y)
        self.val_losses.append(loss.item())
        self.log("val/loss", loss)

    def configure_optimizers(self):
        if self.hparams.optimizer == "adam":
            opt = torch.optim.Adam(self.parameters(), lr=0.01)
        else:
            opt = torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)
        return {
            "optimizer": opt,
            "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7),
        }


def run_fit(tmp_path, *, seed: int = 0, ckpt_path=None, val: bool = False, task_cls=Net, task_kw=None, **kw):
    """Seed, build task_cls(**task_kw), fit on CountingData (shuffled) with FAST overridden by kw."""
    torch.manual_seed(seed)
    task = task_cls(**(task_kw or {}))
    data = CountingData()
    loader = DataLoader(data, batch_size=4, shuffle=True)
    val_loader = DataLoader(CountingData(8), batch_size=4) if val else None
    trainer = Trainer(default_root_dir=str(tmp_path), **{**FAST, **kw})
    trainer.fit(task, loader, val_loader, ckpt_path=ckpt_path)
    return task, trainer, data


def assert_equal_weights(a: nn.Module, b: nn.Module) -> None:
    """The same keys and bit-identical tensors."""
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k
