"""configure_optimizers: every accepted form, scheduler intervals and frequencies, ReduceLROnPlateau."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import FAST
from torch import nn
from torch.optim.lr_scheduler import ReduceLROnPlateau, StepLR
from torch.utils.data import DataLoader, TensorDataset

from tandem_core.errors import ConfigError, TaskError
from tandem_core.optim import SchedulerConfig
from trainer import Task, Trainer
from trainer.loop.optim import parse_optimizers


def params() -> list[nn.Parameter]:
    return list(nn.Linear(2, 1).parameters())


def sgd(lr: float = 1.0) -> torch.optim.SGD:
    return torch.optim.SGD(params(), lr=lr)


# ----- parsing -----------------------------------------------------------------------------------


def test_single_optimizer():
    opt = sgd()
    assert parse_optimizers(opt) == ([opt], [])


def test_list_and_tuple_of_optimizers():
    a, b = sgd(), sgd()
    assert parse_optimizers([a, b]) == ([a, b], [])
    assert parse_optimizers((a,)) == ([a], [])


def test_two_lists():
    a = sgd()
    s = StepLR(a, 1)
    opts, scheds = parse_optimizers(([a], [s]))
    assert opts == [a] and scheds == [SchedulerConfig(s)]
    opts, scheds = parse_optimizers([[a], [{"scheduler": s, "interval": "step"}]])
    assert scheds[0].interval == "step"


def test_dict_with_scheduler_object():
    a = sgd()
    s = StepLR(a, 1)
    opts, scheds = parse_optimizers({"optimizer": a, "lr_scheduler": s})
    assert opts == [a] and scheds == [SchedulerConfig(s, interval="epoch", frequency=1)]


def test_dict_with_scheduler_dict():
    a = sgd()
    s = StepLR(a, 1)
    out = {"optimizer": a, "lr_scheduler": {"scheduler": s, "interval": "step", "frequency": 3, "name": "lr"}}
    _, scheds = parse_optimizers(out)
    assert scheds == [SchedulerConfig(s, interval="step", frequency=3, name="lr")]


def test_dict_without_scheduler_and_list_of_dicts():
    a, b = sgd(), sgd()
    assert parse_optimizers({"optimizer": a}) == ([a], [])
    assert parse_optimizers({"optimizer": a, "lr_scheduler": None}) == ([a], [])
    s = StepLR(b, 1)
    opts, scheds = parse_optimizers([{"optimizer": a}, {"optimizer": b, "lr_scheduler": s}])
    assert opts == [a, b] and [c.scheduler for c in scheds] == [s]


def test_plateau_with_monitor():
    a = sgd()
    p = ReduceLROnPlateau(a)
    _, scheds = parse_optimizers({"optimizer": a, "lr_scheduler": p, "monitor": "val/loss"})
    assert scheds[0].monitor == "val/loss" and scheds[0].is_plateau
    _, scheds = parse_optimizers({"optimizer": a, "lr_scheduler": {"scheduler": p, "monitor": "train/loss"}})
    assert scheds[0].monitor == "train/loss"


def test_plateau_without_monitor_says_how_to_fix():
    a = sgd()
    with pytest.raises(TaskError, match=r"ReduceLROnPlateau needs a metric: return \{'optimizer': opt"):
        parse_optimizers({"optimizer": a, "lr_scheduler": ReduceLROnPlateau(a)})


@pytest.mark.parametrize(
    ("out", "match"),
    [
        ([], "configure_optimizers returned list"),
        ("sgd", "configure_optimizers returned str"),
        ([nn.Linear(1, 1)], "returned Linear where an optimizer was expected"),
        ({"lr_scheduler": None}, "needs key 'optimizer'"),
    ],
)
def test_bad_forms(out, match):
    with pytest.raises(TaskError, match=match):
        parse_optimizers(out)


def test_bad_scheduler_dict():
    a = sgd()
    with pytest.raises(TaskError, match="interval must be 'step' or 'epoch', got 'batch'"):
        parse_optimizers({"optimizer": a, "lr_scheduler": {"scheduler": StepLR(a, 1), "interval": "batch"}})
    # as Lightning: an unknown key is a RuntimeWarning (and dropped), the missing scheduler an error
    with pytest.raises(TaskError, match="must have 'scheduler'"), pytest.warns(RuntimeWarning, match="sched"):
        parse_optimizers({"optimizer": a, "lr_scheduler": {"sched": StepLR(a, 1)}})


# ----- stepping during fit -------------------------------------------------------------------------


class Task1(Task):
    def __init__(self, make) -> None:
        super().__init__()
        self.net = nn.Linear(4, 1)
        self.make = make
        self.lrs: list[float] = []  # lr used by each optimizer step

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self.net(x), y)
        self.log("train/loss", loss, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val/loss", torch.tensor(1.0))  # never improves: a plateau

    def on_before_optimizer_step(self, optimizer):
        self.lrs.append(optimizer.param_groups[0]["lr"])

    def configure_optimizers(self):
        return self.make(self)


def _fit(make, tmp_path, val: bool = False, **kw) -> Task1:
    torch.manual_seed(0)
    task = Task1(make)
    data = DataLoader(TensorDataset(torch.randn(16, 4), torch.randn(16, 1)), batch_size=4)  # 4 batches
    val_data = DataLoader(TensorDataset(torch.randn(4, 4), torch.randn(4, 1)), batch_size=4) if val else None
    Trainer(default_root_dir=str(tmp_path), **{**FAST, **kw}).fit(task, data, val_data)
    return task


def test_epoch_scheduler_with_frequency(tmp_path):
    def make(task):
        opt = torch.optim.SGD(task.parameters(), lr=1.0)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": StepLR(opt, 1, gamma=0.5), "frequency": 2}}

    task = _fit(make, tmp_path, max_epochs=5)
    assert task.lrs == [1.0] * 8 + [0.5] * 8 + [0.25] * 4


def test_step_scheduler_with_frequency(tmp_path):
    def make(task):
        opt = torch.optim.SGD(task.parameters(), lr=1.0)
        sched = StepLR(opt, 1, gamma=0.5)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step", "frequency": 3}}

    task = _fit(make, tmp_path, max_epochs=2)
    assert task.lrs == [1.0] * 3 + [0.5] * 3 + [0.25] * 2


def test_step_scheduler_counts_optimizer_steps_under_accumulation(tmp_path):
    def make(task):
        opt = torch.optim.SGD(task.parameters(), lr=1.0)
        return {
            "optimizer": opt,
            "lr_scheduler": {"scheduler": StepLR(opt, 1, gamma=0.5), "interval": "step"},
        }

    task = _fit(make, tmp_path, max_epochs=1, accumulate_grad_batches=2)
    assert task.lrs == [1.0, 0.5]


def test_plateau_on_validation_metric(tmp_path):
    def make(task):
        opt = torch.optim.SGD(task.parameters(), lr=1.0)
        sched = ReduceLROnPlateau(opt, patience=0, factor=0.5)
        return {"optimizer": opt, "lr_scheduler": sched, "monitor": "val/loss"}

    task = _fit(make, tmp_path, val=True, max_epochs=4)
    # epoch 0 sets the best value; every later epoch fails to improve and halves the lr
    assert task.lrs == [1.0] * 8 + [0.5] * 4 + [0.25] * 4


def test_plateau_on_train_epoch_metric(tmp_path):
    def make(task):
        opt = torch.optim.SGD(task.parameters(), lr=1.0)
        # only a drop by more than 10 counts as improvement: after the first epoch nothing improves
        sched = ReduceLROnPlateau(opt, patience=0, factor=0.1, threshold=10.0, threshold_mode="abs")
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "monitor": "train/loss_epoch"}}

    task = _fit(make, tmp_path, max_epochs=3)
    assert task.lrs == [1.0] * 8 + [pytest.approx(0.1)] * 4


def test_plateau_with_unlogged_metric_names_logged_keys(tmp_path):
    def make(task):
        opt = torch.optim.SGD(task.parameters(), lr=1.0)
        return {"optimizer": opt, "lr_scheduler": ReduceLROnPlateau(opt), "monitor": "val_acc"}

    with pytest.raises(
        ConfigError, match=r"monitors 'val_acc', which was not logged; logged keys: \[.*'val/loss'"
    ):
        _fit(make, tmp_path, val=True, max_epochs=1)


def test_plateau_not_strict_skips_missing_metric(tmp_path):
    def make(task):
        opt = torch.optim.SGD(task.parameters(), lr=1.0)
        sched = {"scheduler": ReduceLROnPlateau(opt), "monitor": "nope", "strict": False}
        return {"optimizer": opt, "lr_scheduler": sched}

    task = _fit(make, tmp_path, max_epochs=2)
    assert task.lrs == [1.0] * 8


def test_missing_monitor_fails_at_fit_start(tmp_path):
    def make(task):
        opt = torch.optim.SGD(task.parameters(), lr=1.0)
        return {"optimizer": opt, "lr_scheduler": ReduceLROnPlateau(opt)}

    with pytest.raises(TaskError, match="ReduceLROnPlateau needs a metric"):
        _fit(make, tmp_path, max_epochs=1)


def test_estimated_stepping_batches_for_onecycle(tmp_path):
    def make(task):
        opt = torch.optim.SGD(task.parameters(), lr=0.1)
        total = task.trainer.estimated_stepping_batches
        task.total = total
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=total)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    task = _fit(make, tmp_path, max_epochs=3, accumulate_grad_batches=3)
    assert task.total == 6 and len(task.lrs) == 6  # ceil(4 / 3) = 2 steps per epoch
    task = _fit(make, tmp_path, max_steps=5)
    assert task.total == 5


def test_lr_schedulers_and_optimizers_accessors(tmp_path):
    seen = {}

    def make(task):
        opt = torch.optim.SGD(task.parameters(), lr=1.0)
        return [opt], [StepLR(opt, 1)]

    class Spy(Task1):
        def on_train_start(self):
            seen["sched"] = self.lr_schedulers()
            seen["opt"] = self.optimizers()

    torch.manual_seed(0)
    task = Spy(make)
    trainer = Trainer(max_epochs=1, default_root_dir=str(tmp_path), **FAST)
    trainer.fit(task, DataLoader(TensorDataset(torch.randn(4, 4), torch.randn(4, 1)), batch_size=4))
    assert seen["sched"] is trainer.lr_scheduler_configs[0].scheduler
    assert seen["opt"].param_groups is trainer.optimizers[0].param_groups


def test_lbfgs_with_manual_optimization_matches_torch(tmp_path):
    data = TensorDataset(torch.randn(16, 4), torch.randn(16, 1))

    class Manual(Task):
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False
            self.net = nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            opt = self.optimizers()

            def closure():
                opt.zero_grad()
                loss = F.mse_loss(self.net(x), y)
                self.manual_backward(loss)
                return loss

            opt.step(closure)

        def configure_optimizers(self):
            return torch.optim.LBFGS(self.parameters(), lr=0.5, max_iter=3)

    torch.manual_seed(0)
    ref = nn.Linear(4, 1)
    opt = torch.optim.LBFGS(ref.parameters(), lr=0.5, max_iter=3)
    for x, y in DataLoader(data, batch_size=8):

        def closure(x=x, y=y):
            opt.zero_grad()
            loss = F.mse_loss(ref(x), y)
            loss.backward()
            return loss

        opt.step(closure)
    torch.manual_seed(0)
    task = Manual()
    trainer = Trainer(max_epochs=1, default_root_dir=str(tmp_path), **FAST)
    trainer.fit(task, DataLoader(data, batch_size=8))
    assert torch.equal(task.net.weight, ref.weight) and torch.equal(task.net.bias, ref.bias)
    assert trainer.global_step == 2
