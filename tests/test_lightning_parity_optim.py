"""What configure_optimizers may return and how its optimizers and schedulers are stepped, compared with Lightning
2.6 on the same small task: keywords of a manual ``opt.step(...)`` reach the optimizer, schedulers under manual
optimization, None (no optimizer), unknown keys, strict=False, the checks Lightning makes when fit starts, and a
step-interval ReduceLROnPlateau stepped after its batch's validation."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from tandem_core.errors import TandemError
from trainer import Task, Trainer

pl = pytest.importorskip("pytorch_lightning")
QUIET = dict(
    logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    num_sanity_val_steps=0,
)  # fmt: skip
BASES = (pl.LightningModule, Task)


def _data(n: int = 16) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(n, 3, generator=g)), batch_size=4)


class Recording(torch.optim.SGD):
    """SGD that records the keywords of each step."""

    def __init__(self, params, seen):
        super().__init__(params, lr=0.1)
        self.seen = seen

    def step(self, closure=None, **kwargs):
        self.seen.append(sorted(kwargs))
        return super().step(closure)


def _task(base, optimizers=None, manual=False, training_step=None, **attrs):
    class T(base):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(3, 1)
            self.automatic_optimization = not manual
            self.seen: list = []

        def training_step(self, batch, batch_idx):
            if training_step is not None:
                return training_step(self, batch, batch_idx)
            return self.net(batch[0]).pow(2).mean()

        def validation_step(self, batch, batch_idx):
            self.log("val_loss", self.net(batch[0]).pow(2).mean())

        def configure_optimizers(self):
            return optimizers(self) if optimizers is not None else torch.optim.SGD(self.parameters(), lr=0.1)

    for k, v in attrs.items():
        setattr(T, k, v)
    return T()


def _fit(base, task, val=False, **kw):
    trainer = (pl.Trainer if base is pl.LightningModule else Trainer)(
        **{**QUIET, "max_epochs": 1, **kw}, **({"accelerator": "cpu"} if base is pl.LightningModule else {})
    )
    trainer.fit(task, _data(), _data(8) if val else None)
    return trainer


def test_manual_step_keywords_reach_the_optimizer():
    def step(self, batch, batch_idx):
        opt = self.optimizers()
        opt.zero_grad()
        self.manual_backward(self.net(batch[0]).pow(2).mean())
        opt.step(custom="x") if batch_idx % 2 == 0 else opt.step()

    seen = []
    for base in BASES:
        task = _task(base, lambda t: Recording(t.parameters(), t.seen), manual=True, training_step=step)
        _fit(base, task)
        seen.append(task.seen)
    assert seen[1] == seen[0] == [["custom"], [], ["custom"], []]


@pytest.mark.parametrize("as_dict", [True, False])
def test_manual_optimization_takes_a_plateau_scheduler_without_monitor(as_dict):
    def optimizers(t):
        opt = torch.optim.SGD(t.parameters(), lr=0.1)
        sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt)
        return [opt], [{"scheduler": sched, "monitor": "x", "interval": "step"} if as_dict else sched]

    def step(self, batch, batch_idx):
        return None

    intervals = []
    for base in BASES:
        task = _task(base, optimizers, manual=True, training_step=step)
        if as_dict:
            with pytest.warns(RuntimeWarning, match="monitor"):
                trainer = _fit(base, task)
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("error", RuntimeWarning)
                trainer = _fit(base, task)
        intervals.append(trainer.lr_scheduler_configs[0].interval)
    assert intervals[1] == intervals[0]


def test_none_from_configure_optimizers_trains_without_an_optimizer():
    weights = []
    for base in BASES:
        task = _task(base, lambda t: None)
        before = task.net.weight.detach().clone()
        with pytest.warns(UserWarning, match="no optimizer"):
            _fit(base, task)
        weights.append(torch.equal(task.net.weight, before))
    assert weights == [True, True]


def test_unknown_keys_warn_and_are_ignored():
    def sched_dict(t):
        opt = torch.optim.SGD(t.parameters(), lr=0.1)
        return {
            "optimizer": opt,
            "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.StepLR(opt, 1), "foo": 1},
        }

    def optim_dict(t):
        return {"optimizer": torch.optim.SGD(t.parameters(), lr=0.1), "bar": 2}

    for base in BASES:
        for optimizers, word in ((sched_dict, "foo"), (optim_dict, "bar")):
            with pytest.warns(RuntimeWarning, match=word):
                _fit(base, _task(base, optimizers), max_steps=1)


def test_plateau_strict_false_warns_when_the_metric_is_missing():
    def optimizers(t):
        opt = torch.optim.SGD(t.parameters(), lr=0.1)
        sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "monitor": "giraffe", "strict": False}}

    for base in BASES:
        with pytest.warns(RuntimeWarning, match="giraffe"):
            _fit(base, _task(base, optimizers))


class NotTorch:
    def __init__(self, optimizer):
        self.optimizer = optimizer

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


class NoState:
    def __init__(self, optimizer):
        self.optimizer = optimizer


@pytest.mark.parametrize(
    "optimizers, manual, error",
    [
        # a scheduler on an optimizer configure_optimizers did not return
        (lambda t: ([torch.optim.SGD(t.parameters(), lr=0.1)],
                    [torch.optim.lr_scheduler.StepLR(torch.optim.SGD(t.parameters(), lr=0.1), 1)]), False, None),
        # a scheduler that is no torch LRScheduler: refused under automatic optimization only
        (lambda t: ([o := torch.optim.SGD(t.parameters(), lr=0.1)], [NotTorch(o)]), False, None),
        (lambda t: ([o := torch.optim.SGD(t.parameters(), lr=0.1)], [NotTorch(o)]), True, "ok"),
        # a scheduler without state_dict/load_state_dict: a TypeError in both
        (lambda t: ([o := torch.optim.SGD(t.parameters(), lr=0.1)], [NoState(o)]), True, TypeError),
        # two optimizers under automatic optimization: a RuntimeError in both
        (lambda t: [torch.optim.SGD(t.parameters(), lr=0.1), torch.optim.SGD(t.parameters(), lr=0.1)], False,
         RuntimeError),
    ],
    ids=["unreturned-optimizer", "not-torch-automatic", "not-torch-manual", "no-state", "two-automatic"],
)  # fmt: skip
def test_fit_start_checks_as_lightning(optimizers, manual, error):
    step = (lambda self, batch, batch_idx: None) if manual else None
    for base in BASES:
        task = _task(base, optimizers, manual=manual, training_step=step)
        if error == "ok":
            _fit(base, task, max_epochs=0)
            continue
        expected = error or (
            pl.utilities.exceptions.MisconfigurationException if base is pl.LightningModule else TandemError
        )
        with pytest.raises(expected):
            _fit(base, task, max_epochs=0)


def test_optimizer_idx_in_training_step_is_a_runtime_error():
    for base in BASES:

        class Old(type(_task(base))):
            def training_step(self, batch, batch_idx, optimizer_idx):
                return self.net(batch[0]).sum()

        with pytest.raises(RuntimeError, match="optimizer_idx"):
            _fit(base, Old())


def test_step_interval_plateau_steps_after_the_batchs_validation():
    def optimizers(t):
        opt = torch.optim.SGD(t.parameters(), lr=0.1)
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt)
        step = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=1.0)
        return [opt], [{"scheduler": plateau, "interval": "step", "monitor": "val_loss"},
                       {"scheduler": step, "interval": "step"}]  # fmt: skip

    def on_validation_end(self):
        plateau, step = self.lr_schedulers()
        self.seen.append((self.global_step, plateau.last_epoch, step.last_epoch))

    seen = []
    for base in BASES:
        task = _task(base, optimizers, on_validation_end=on_validation_end)
        _fit(base, task, val=True, max_epochs=2, val_check_interval=1)
        seen.append(task.seen)
    assert seen[1] == seen[0]
    assert seen[0][:2] == [(1, 0, 1), (2, 1, 2)]  # the plateau one steps after the batch's validation


def test_a_skipped_training_step_under_several_processes_is_a_runtime_error(monkeypatch):
    """Lightning's test_skip_training_step_not_allowed: training_step returning None (skip the batch) is fine
    on one process and a RuntimeError under several (the other ranks would wait for this one's gradients).
    Lightning's test sets `trainer.strategy.world_size`; here the Trainer's world size is made 2 the same way."""
    from trainer.demos import BoringModel

    class Skips(BoringModel):
        def training_step(self, batch, batch_idx):
            return None

    Trainer(max_steps=1, barebones=True).fit(Skips())
    monkeypatch.setattr(Trainer, "world_size", property(lambda self: 2))
    with pytest.raises(RuntimeError, match="returned None .* under several processes"):
        Trainer(max_steps=1, barebones=True).fit(Skips())
