"""The Tuner (trainer/tuner/): lr_find and scale_batch_size leave the model, optimizer, loop, random state and
directories as they found them (a fit afterwards equals a fit without them), and their callbacks
(LearningRateFinder, BatchSizeFinder) run inside fit. lr_find's suggestion against Lightning's and the
simulated out-of-memory search are in tests/ports/test_port_tricks.py."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F
from conftest import FAST
from torch.utils.data import DataLoader, TensorDataset

from callbacks import BatchSizeFinder, Callback, LearningRateFinder
from tandem_core.errors import ConfigError
from trainer import Task, Trainer, Tuner
from trainer.seed import get_rng_state

# Net keeps batch_size as an attribute and as a hyperparameter (both are set): the finder says so
pytestmark = pytest.mark.filterwarnings("ignore:task.batch_size and task.hparams.batch_size")


def data() -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(96, 3, generator=g)
    return TensorDataset(x, (x.sum(1) > 0).long())


class Net(Task):
    def __init__(self, lr: float = 0.01, batch_size: int = 8) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.lr, self.batch_size = lr, batch_size
        self.net = torch.nn.Sequential(torch.nn.Linear(3, 16), torch.nn.Dropout(0.1), torch.nn.Linear(16, 2))
        self.trained_batches: list[int] = []

    def training_step(self, batch, batch_idx):
        self.trained_batches.append(batch[0].shape[0])
        return F.cross_entropy(self.net(batch[0]), batch[1])

    def test_step(self, batch, batch_idx):
        self.trained_batches.append(batch[0].shape[0])

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.lr)

    def train_dataloader(self):
        return DataLoader(data(), batch_size=self.batch_size, shuffle=True)

    def test_dataloader(self):
        return DataLoader(data(), batch_size=self.batch_size)


def _weights(task: Task) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in task.state_dict().items()}


def _equal(a: dict, b: dict) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a)


def _same_rng(a: dict, b: dict) -> bool:
    return (
        torch.equal(a["torch"], b["torch"])
        and a["python"] == b["python"]
        and torch.equal(a["numpy"][1], b["numpy"][1])
    )


def _fit(task: Task, tmp_path, callbacks=(), **kw) -> Trainer:
    trainer = Trainer(
        max_epochs=2, default_root_dir=str(tmp_path), callbacks=list(callbacks), **{**FAST, **kw}
    )
    trainer.fit(task)
    return trainer


def test_lr_find_changes_nothing_but_the_rate(tmp_path):
    torch.manual_seed(0)
    plain = Net()
    _fit(plain, tmp_path / "plain")
    torch.manual_seed(0)
    task = Net()
    before, rng = _weights(task), get_rng_state()
    trainer = Trainer(max_epochs=2, default_root_dir=str(tmp_path / "tuned"), **FAST)
    finder = Tuner(trainer).lr_find(task, num_training=20, update_attr=False)
    assert len(finder.results["lr"]) == 20 and finder.results["lr"][0] == pytest.approx(1e-8)
    assert _equal(_weights(task), before) and _same_rng(get_rng_state(), rng)
    assert trainer.global_step == 0 and trainer.callbacks == Trainer(**FAST).callbacks
    assert not os.path.exists(tmp_path / "tuned")  # no file, no directory
    trainer.fit(task)
    assert _equal(_weights(task), _weights(plain))  # as if the Tuner had not run


def test_lr_find_sets_the_suggestion_in_the_task_and_its_hparams(tmp_path):
    torch.manual_seed(0)
    task = Net()
    finder = Tuner(Trainer(**FAST)).lr_find(task, num_training=30)
    assert task.lr == task.hparams.lr == finder.suggestion() != 0.01
    fig = finder.plot(suggest=True)
    assert fig.axes[0].get_xscale() == "log" and len(fig.axes[0].lines) == 2  # the curve and the suggestion


class FirstStep(Callback):
    """What the optimizer and weights look like when training really starts."""

    def on_train_start(self, trainer, task):
        self.weights, self.lrs = _weights(task), [g["lr"] for g in trainer.optimizers[0].param_groups]
        self.state = trainer.optimizers[0].state_dict()["state"]


def test_learning_rate_finder_callback_runs_when_fit_starts(tmp_path):
    torch.manual_seed(0)
    task = Net()
    initial = _weights(task)
    finder, probe = LearningRateFinder(num_training_steps=20), FirstStep()
    trainer = _fit(task, tmp_path, [finder, probe])
    lr = finder.optimal_lr.suggestion()
    assert _equal(probe.weights, initial) and probe.state == {} and probe.lrs == [lr] and task.lr == lr
    assert trainer.global_step == 2 * 12  # the range test's steps are not counted
    torch.manual_seed(0)
    reference = Net(lr=lr)
    _fit(reference, tmp_path / "ref")
    assert _equal(_weights(task), _weights(reference))  # fit goes on as if started at the suggested rate


def test_batch_size_finder_callback_resizes_the_loaders_fit_uses(tmp_path):
    torch.manual_seed(0)
    task = Net(batch_size=4)
    initial = _weights(task)
    probe = FirstStep()
    trainer = _fit(task, tmp_path, [BatchSizeFinder(max_trials=3), probe])  # 2, 4, 8 (no out-of-memory here)
    assert task.batch_size == task.hparams.batch_size == 8 and _equal(probe.weights, initial)
    assert task.trained_batches[-24:] == [8] * 24 and trainer.global_step == 24


def test_scale_batch_size_for_test(tmp_path):
    task = Net(batch_size=4)
    size = Tuner(Trainer(default_root_dir=str(tmp_path), **FAST)).scale_batch_size(
        task, method="test", max_trials=4
    )
    assert size == 16 and task.batch_size == 16
    task.trained_batches.clear()
    Trainer(callbacks=[BatchSizeFinder(max_trials=2, init_val=4)], **FAST).test(task, verbose=False)
    assert task.batch_size == 8 and task.trained_batches[-12:] == [8] * 12


def test_what_the_tuner_refuses(tmp_path):
    tuner = Tuner(Trainer(**FAST))
    with pytest.raises(ConfigError, match="method"):
        tuner.lr_find(Net(), method="test")
    with pytest.raises(ConfigError, match="pass dataloaders"):
        tuner.scale_batch_size(Net(), method="test", train_dataloaders=DataLoader(data()))
    with pytest.raises(ConfigError, match="resize"):
        tuner.scale_batch_size(Net(), train_dataloaders=DataLoader(data(), batch_size=4))
    with pytest.raises(ConfigError, match="not found"):
        tuner.scale_batch_size(Net(), batch_arg_name="bs")
    with pytest.raises(ConfigError, match="one process"):
        Tuner(Trainer(strategy="ddp", devices=2, **FAST)).scale_batch_size(Net())
    with pytest.raises(ConfigError, match="already has"):
        Tuner(Trainer(callbacks=[LearningRateFinder()], **FAST)).lr_find(Net())


class Counting(Net):
    """Net with buffers the checkpoint does not hold (persistent=False): a step counter that scales the loss
    and a cache replaced by a new tensor each step. The Tuner's trials change both."""

    def __init__(self, lr: float = 0.01, batch_size: int = 8) -> None:
        super().__init__(lr, batch_size)
        self.register_buffer("calls", torch.zeros(()), persistent=False)
        self.register_buffer("cache", torch.zeros(3), persistent=False)

    def training_step(self, batch, batch_idx):
        self.calls += 1
        self.cache = batch[0].mean(0).detach() + self.cache  # a new tensor, not an in-place update
        loss = super().training_step(batch, batch_idx)
        return loss * (1 + 0.01 * self.calls) + self.cache.sum() * 0.001


@pytest.mark.parametrize("tune", ["lr_find", "scale_batch_size"])
def test_a_fit_after_the_tuner_is_bit_identical_to_one_without_it(tune, tmp_path):
    """Issue 34: every buffer (non-persistent ones too), the random state, loaders and options come back."""
    torch.manual_seed(0)
    task = Counting(batch_size=4)
    trainer = Trainer(max_epochs=2, default_root_dir=str(tmp_path / "tuned"), **FAST)
    if tune == "lr_find":
        Tuner(trainer).lr_find(task, num_training=20, update_attr=False)
    else:
        assert Tuner(trainer).scale_batch_size(task, max_trials=3) == task.batch_size == 8
    assert task.calls.item() == 0 and torch.equal(task.cache, torch.zeros(3))
    trainer.fit(task)
    torch.manual_seed(0)
    plain = Counting(batch_size=task.batch_size)
    _fit(plain, tmp_path / "plain")
    assert _equal(_weights(task), _weights(plain))
    assert torch.equal(task.calls, plain.calls) and torch.equal(task.cache, plain.cache)
