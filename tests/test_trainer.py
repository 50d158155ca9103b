"""Trainer entry points: fit/validate/test/predict results, callbacks, properties, options."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import FAST
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from callbacks import Callback
from strategies import SingleDeviceStrategy
from tandem_core.errors import ConfigError
from trainer import Task, Trainer


def make_data(n: int = 8, seed: int = 0) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(n, 4, generator=g), torch.randn(n, 1, generator=g))


def loader(n: int = 8, seed: int = 0, batch_size: int = 4) -> DataLoader:
    return DataLoader(make_data(n, seed), batch_size=batch_size)


class Net(Task):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Linear(4, 1)

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.mse_loss(self(x), y)

    def _loss(self, batch):
        x, y = batch
        return F.mse_loss(self(x), y, reduction="sum"), len(x)

    def validation_step(self, batch, batch_idx, dataloader_idx=0):
        loss, n = self._loss(batch)
        self.log("val/loss", loss / n)

    def test_step(self, batch, batch_idx, dataloader_idx=0):
        loss, n = self._loss(batch)
        self.log("test/loss", loss / n)
        self.log("test/sum", loss, reduce_fx="sum")

    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        return self(batch[0]) + 100 * dataloader_idx

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def trainer(tmp_path, **kw) -> Trainer:
    return Trainer(default_root_dir=str(tmp_path), **{**FAST, **kw})


def _mse(task: Net, ds: TensorDataset) -> tuple[float, float]:
    x, y = ds.tensors
    with torch.no_grad():
        err = F.mse_loss(task(x), y, reduction="sum").item()
    return err / len(x), err


def test_validate_returns_the_epoch_mean(tmp_path):
    task = Net()
    out = trainer(tmp_path).validate(task, loader(10, batch_size=4))  # batches of 4, 4, 2: weighted mean
    assert len(out) == 1 and list(out[0]) == ["val/loss"]
    assert out[0]["val/loss"] == pytest.approx(_mse(task, make_data(10))[0], rel=1e-5)


def test_test_returns_mean_and_sum(tmp_path):
    task = Net()
    out = trainer(tmp_path).test(task, loader(12, batch_size=5))
    mean, total = _mse(task, make_data(12))
    assert out == [{"test/loss": pytest.approx(mean, rel=1e-5), "test/sum": pytest.approx(total, rel=1e-5)}]


def test_validate_with_two_loaders_returns_one_dict_per_loader(tmp_path):
    task = Net()
    out = trainer(tmp_path).validate(task, [loader(8, seed=1), loader(4, seed=2)])
    assert len(out) == 2
    assert out[0] == {"val/loss/dataloader_idx_0": pytest.approx(_mse(task, make_data(8, 1))[0], rel=1e-5)}
    assert out[1] == {"val/loss/dataloader_idx_1": pytest.approx(_mse(task, make_data(4, 2))[0], rel=1e-5)}


def test_dataloader_idx_is_passed_for_every_loader_when_there_are_several(tmp_path):
    seen = []

    class Strict(Net):
        def validation_step(self, batch, batch_idx, dataloader_idx):  # no default, as Lightning allows
            seen.append((dataloader_idx, batch_idx))

        def test_step(self, batch, batch_idx):  # one loader: two arguments
            seen.append(("test", batch_idx))

    t = trainer(tmp_path)
    t.validate(Strict(), [loader(4), loader(8)])
    t.test(Strict(), loader(4))
    assert seen == [(0, 0), (1, 0), (1, 1), ("test", 0)]


def test_limit_val_batches(tmp_path):
    seen = []

    class Spy(Net):
        def validation_step(self, batch, batch_idx, dataloader_idx=0):
            seen.append(batch_idx)

    trainer(tmp_path, limit_val_batches=2).validate(Spy(), loader(20))
    assert seen == [0, 1]
    seen.clear()
    trainer(tmp_path, limit_val_batches=0).validate(Spy(), loader(20))
    assert seen == []


def test_predict_returns_outputs(tmp_path):
    task = Net()
    x = make_data(8).tensors[0]
    out = trainer(tmp_path).predict(task, loader(8))
    assert len(out) == 2
    torch.testing.assert_close(torch.cat(out), task(x).detach())
    two = trainer(tmp_path).predict(task, [loader(8), loader(4, seed=1)])
    assert len(two) == 2 and len(two[0]) == 2 and len(two[1]) == 1
    torch.testing.assert_close(two[1][0], task(make_data(4, 1).tensors[0]).detach() + 100)


def test_predict_uses_task_dataloader_and_limit(tmp_path):
    class WithPredict(Net):
        def predict_dataloader(self):
            return loader(16)

    out = trainer(tmp_path, limit_predict_batches=3).predict(WithPredict())
    assert len(out) == 3


def test_validate_after_fit_reuses_the_task(tmp_path):
    task = Net()
    t = trainer(tmp_path, max_epochs=2)
    t.fit(task, loader(), loader(4, seed=3))
    fit_val = float(t.callback_metrics["val/loss"])
    out = t.validate(task, dataloaders=loader(4, seed=3))
    assert out[0]["val/loss"] == pytest.approx(fit_val)
    # without the task, as Lightning: the best checkpoint of the fit, which needs a ModelCheckpoint
    with pytest.raises(ConfigError, match="ModelCheckpoint` is not configured"):
        t.validate(dataloaders=loader(4, seed=3))
    assert t.global_step == 4  # validate does not train


def test_fit_validates_every_epoch_and_exposes_metrics(tmp_path):
    from trainer.loggers import CSVLogger

    task = Net()
    t = trainer(tmp_path, max_epochs=3)
    t.fit(task, loader(), loader(4, seed=3))
    assert t.current_epoch == 3 and t.global_step == 6
    assert float(t.callback_metrics["val/loss"]) == pytest.approx(_mse(task, make_data(4, 3))[0], rel=1e-5)
    # as Lightning: the values logged for loggers are kept even when no logger is configured
    assert t.logged_metrics["val/loss"] == pytest.approx(float(t.callback_metrics["val/loss"]))
    t = trainer(tmp_path, max_epochs=3, logger=CSVLogger(str(tmp_path)))
    t.fit(Net(), loader(), loader(4, seed=3))
    assert t.logged_metrics["val/loss"] == pytest.approx(float(t.callback_metrics["val/loss"]))


def test_sanity_check_metrics_are_not_kept(tmp_path):
    class Spy(Net):
        def on_train_start(self):
            self.at_start = dict(self.trainer.callback_metrics)

    task = Spy()
    t = trainer(tmp_path, max_epochs=1, num_sanity_val_steps=2)
    t.fit(task, loader(), loader(4))
    assert task.at_start == {}


def test_callbacks_get_trainer_and_task_in_order(tmp_path):
    calls: list[tuple[str, str]] = []

    class Plain(Callback):
        def on_train_epoch_end(self, trainer, task):
            assert isinstance(trainer, Trainer) and isinstance(task, Net)
            calls.append(("plain", "epoch_end"))

        def on_train_batch_end(self, trainer, task, outputs, batch, batch_idx):
            calls.append(("plain", f"batch_end:{batch_idx}:{trainer.global_step}"))

        def on_validation_end(self, trainer, task):
            calls.append(("plain", "val_end"))

    class Monitor(Callback):
        monitoring = True

        def on_train_epoch_end(self, trainer, task):
            calls.append(("monitor", "epoch_end"))

    class T(Net):
        def on_train_epoch_end(self):
            calls.append(("task", "epoch_end"))

    # the monitoring callback is listed first but runs after the task
    trainer(tmp_path, max_epochs=1, callbacks=[Monitor(), Plain()]).fit(T(), loader(), loader(4))
    assert calls == [
        ("plain", "batch_end:0:1"),
        ("plain", "batch_end:1:2"),
        ("plain", "val_end"),
        ("plain", "epoch_end"),
        ("task", "epoch_end"),
        ("monitor", "epoch_end"),
    ]


def test_single_callback_and_strategy_instance(tmp_path):
    class Count(Callback):
        n = 0

        def on_train_batch_start(self, trainer, task, batch, batch_idx):
            Count.n += 1

    t = trainer(tmp_path, max_epochs=1, callbacks=Count(), strategy=SingleDeviceStrategy("cpu"))
    t.fit(Net(), loader())
    assert Count.n == 2 and t.strategy.root_device == torch.device("cpu")
    assert t.global_rank == 0 and t.world_size == 1 and t.is_global_zero


def test_max_epochs_default_and_unlimited(tmp_path):
    # as Lightning: unset, it reads None until fit picks 1000, or -1 under max_steps
    # (tests/test_lightning_parity_flags.py compares both with Lightning)
    assert trainer(tmp_path).max_epochs is None and trainer(tmp_path).config.max_epochs == 1000
    assert trainer(tmp_path, max_steps=5).max_epochs is None
    t = trainer(tmp_path, max_epochs=-1, max_steps=5)
    t.fit(Net(), loader())
    assert t.global_step == 5


def test_estimated_stepping_batches(tmp_path):
    seen = {}

    class Spy(Net):
        def on_train_start(self):
            seen["n"] = self.trainer.estimated_stepping_batches

    trainer(tmp_path, max_epochs=3, accumulate_grad_batches=2).fit(Spy(), loader(20))  # 5 batches -> 3 steps
    assert seen["n"] == 9
    trainer(tmp_path, max_epochs=3, limit_train_batches=2).fit(Spy(), loader(20))
    assert seen["n"] == 6


def test_min_epochs_overrides_should_stop(tmp_path):
    class Stop(Net):
        def on_train_epoch_end(self):
            self.trainer.should_stop = True

    t = trainer(tmp_path, max_epochs=5, min_epochs=3)
    t.fit(Stop(), loader())
    assert t.current_epoch == 3


def test_deterministic_flag(tmp_path):
    before = torch.are_deterministic_algorithms_enabled()
    try:
        trainer(tmp_path, max_steps=1, deterministic=True).fit(Net(), loader())
        assert torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(before)


def test_log_dir_without_logger(tmp_path):
    assert trainer(tmp_path).log_dir == str(tmp_path)
    assert trainer(tmp_path).logger is None


def test_seed_everything_reproduces_a_run(tmp_path):
    from trainer import seed_everything

    def run():
        seed_everything(7)
        task = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5), nn.Linear(4, 1))

        class Wrap(Net):
            def __init__(self) -> None:
                Task.__init__(self)
                self.net = task

        t = Wrap()
        trainer(tmp_path, max_epochs=2).fit(t, DataLoader(make_data(12), batch_size=4, shuffle=True))
        return [p.detach().clone() for p in t.parameters()]

    assert all(torch.equal(a, b) for a, b in zip(run(), run()))


class _BackwardProbe(torch.autograd.Function):
    """Identity whose backward records the Python call stack (our frames between fit and backward)."""

    stacks: list[list[str]] = []

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        import os
        import traceback

        frames = traceback.extract_stack()
        names = [
            f"{os.path.basename(os.path.dirname(f.filename))}/{os.path.basename(f.filename)}:{f.name}"
            for f in frames
        ]
        _BackwardProbe.stacks.append(names)
        return g


class Probe(Task):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        return _BackwardProbe.apply(self.net(batch[0])).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def calls_from_fit_to_backward(stack: list[str]) -> list[str]:
    """The calls from Trainer.fit down to Tensor.backward (both ends included)."""
    start = next(i for i, f in enumerate(stack) if f.endswith("trainer/trainer.py:fit"))
    end = next(i for i, f in enumerate(stack) if f.endswith("torch/_tensor.py:backward"))
    return stack[start : end + 1]


def _ours(path: list[str]) -> list[str]:
    """The frames of Tandem's own code (not torch's, not the standard library's)."""
    return [f for f in path if f.split("/")[0] in ("trainer", "loop", "strategies", "checkpoint")]


def assert_short_path(path: list[str]) -> None:
    """As Lightning, backward runs inside the optimizer's step (the closure), so the path has two halves; each
    stays short: fit -> loop.fit -> train_epoch -> _step -> optimizer_step -> strategy -> precision -> (the
    optimizer calls) the step closure -> Closure -> strategy.backward -> loss.backward."""
    split = next(i for i, f in enumerate(path) if f.endswith("loop/closure.py:__call__"))
    to_step, from_closure = _ours(path[:split]), path[split:]
    assert len(to_step) <= 8, to_step
    assert len(from_closure) - 1 <= 3, (
        from_closure
    )  # Closure -> strategy.backward (-> DDP) -> Tensor.backward


def test_fit_reaches_loss_backward_in_few_calls():
    _BackwardProbe.stacks.clear()
    Trainer(max_steps=1, **FAST).fit(Probe(), DataLoader(TensorDataset(torch.randn(4, 2)), batch_size=4))
    assert_short_path(calls_from_fit_to_backward(_BackwardProbe.stacks[0]))


def _ddp_backward_path(rank, world_size):
    from strategies.ddp import DDPStrategy

    _BackwardProbe.stacks.clear()
    data = DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=2)
    Trainer(strategy=DDPStrategy(), devices=world_size, max_steps=1, **FAST).fit(Probe(), data)
    return calls_from_fit_to_backward(_BackwardProbe.stacks[0])


def test_ddp_fit_reaches_loss_backward_in_few_calls(dist_run):
    for path in dist_run(_ddp_backward_path):
        assert_short_path(path)
        assert any(f.endswith("strategies/ddp.py:backward") for f in path)


@pytest.mark.parametrize(
    ("kwargs", "reason", "n"),
    [({"max_steps": 0}, "max_steps=0", 8), ({"limit_train_batches": 0}, "limit_train_batches=0", 8),
     ({}, "the training loader is empty", 0)],
)  # fmt: skip
def test_a_fit_that_takes_no_step_says_why_and_ends_normally(tmp_path, kwargs, reason, n):
    task = Probe()
    before = [p.detach().clone() for p in task.parameters()]
    trainer = Trainer(max_epochs=1, default_root_dir=str(tmp_path), **{**FAST, **kwargs})
    with pytest.warns(UserWarning, match=f"fit\\(\\) will take no optimizer step: {reason}"):
        trainer.fit(task, DataLoader(TensorDataset(torch.randn(n, 2)), batch_size=4))
    assert trainer.global_step == 0 and all(torch.equal(a, b) for a, b in zip(before, task.parameters()))
