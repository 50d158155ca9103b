"""Manual optimization: the task steps its optimizers and schedulers itself, compared with a hand loop."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import FAST
from helpers.regression import Regressor, assert_same_weights, dataset, make_net
from torch import nn
from torch.utils.data import DataLoader

from tandem_core.errors import TaskError
from trainer import Task, Trainer


class Manual(Task):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.net = make_net(0.0)
        self.losses: list[float] = []
        self.backward_hooks = 0

    def on_before_backward(self, loss):
        self.backward_hooks += 1

    def on_after_backward(self):
        self.backward_hooks += 1

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        x, y = batch
        loss = F.mse_loss(self.net(x), y)
        self.losses.append(loss.item())
        opt.zero_grad()
        self.manual_backward(loss)
        opt.step()
        if batch_idx == 4:  # last of 5 batches: the user steps the epoch scheduler
            self.lr_schedulers().step()

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)
        return [opt], [torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)]


def test_manual_optimization_matches_hand_loop(tmp_path):
    torch.manual_seed(0)
    model = make_net(0.0)
    loader = DataLoader(dataset(), batch_size=4, shuffle=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    ref = []
    for _ in range(2):
        for x, y in loader:
            loss = F.mse_loss(model(x), y)
            ref.append(loss.item())
            opt.zero_grad()
            loss.backward()
            opt.step()
        sched.step()

    torch.manual_seed(0)
    task = Manual()
    trainer = Trainer(max_epochs=2, default_root_dir=str(tmp_path), **FAST)
    trainer.fit(task, DataLoader(dataset(), batch_size=4, shuffle=True))
    assert task.losses == pytest.approx(ref, abs=1e-6)
    assert_same_weights(task.net, model)
    assert trainer.global_step == 10
    assert task.backward_hooks == 20  # manual_backward runs on_before_backward and on_after_backward
    # the task steps its own scheduler; the trainer must not step it again
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.1 * 0.5**2)


def test_manual_optimization_two_optimizers_and_max_steps(tmp_path):
    class Two(Task):
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False
            self.a, self.b = nn.Linear(4, 1), nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            for opt, net in zip(self.optimizers(), (self.a, self.b)):
                opt.zero_grad()
                self.manual_backward(F.mse_loss(net(x), y))
                opt.step()

        def configure_optimizers(self):
            return [
                torch.optim.SGD(self.a.parameters(), lr=0.1),
                torch.optim.SGD(self.b.parameters(), lr=0.1),
            ]

    torch.manual_seed(0)
    task = Two()
    a0, b0 = task.a.weight.clone(), task.b.weight.clone()
    trainer = Trainer(max_steps=6, default_root_dir=str(tmp_path), **FAST)
    trainer.fit(task, DataLoader(dataset(), batch_size=4))
    assert trainer.global_step == 6  # each opt.step() counts, as in Lightning
    assert not torch.equal(task.a.weight, a0) and not torch.equal(task.b.weight, b0)


def test_automatic_optimization_rejects_two_optimizers(tmp_path):
    class Two(Regressor):
        def configure_optimizers(self):
            return [torch.optim.SGD(self.parameters(), lr=0.1), torch.optim.Adam(self.parameters())]

    with pytest.raises(TaskError, match="automatic_optimization = False"):
        Trainer(max_epochs=1, default_root_dir=str(tmp_path), **FAST).fit(
            Two(), DataLoader(dataset(), batch_size=4)
        )
