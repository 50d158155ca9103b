"""Trainer flags read as Lightning 2.6 reads them, each scenario run under Lightning and Tandem and compared:
when validation runs (val_check_interval, check_val_every_n_epoch), the info messages of explicit batch limits,
PL_TRAINER_* environment defaults, max_epochs read back before and after fit, barebones' refusals,
fast_dev_run's stand-in logger, overfit_batches' sequential sampling, a hook set to None, and the no-grad
context of the evaluation hooks."""

from __future__ import annotations

import logging
import os
import warnings
from unittest import mock

import pytest
import torch
from torch.utils.data import DataLoader, RandomSampler, SequentialSampler, TensorDataset

from strategies.single import SingleDeviceStrategy
from tandem_core.errors import ConfigError, TaskError
from trainer import Task, Trainer
from trainer.loggers.dummy import DummyLogger
from trainer.utilities import PossibleUserWarning

pl = pytest.importorskip("pytorch_lightning")
QUIET = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)


def _data(n: int = 20, batch: int = 4, **kw) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(n, 3, generator=g)), batch_size=batch, **kw)


def _body(base):
    class Body(base):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(3, 1)
            self.val_at: list[tuple[int, int]] = []  # (epoch, global step) of each validation
            self.grad_in_hooks: list[tuple[bool, bool]] = []

        def training_step(self, batch, batch_idx):
            return self.net(batch[0]).pow(2).mean()

        def validation_step(self, batch, batch_idx):
            return None

        def test_step(self, batch, batch_idx):
            return None

        def on_validation_start(self):
            if not self.trainer.sanity_checking:
                self.val_at.append((self.current_epoch, self.global_step))

        def on_test_start(self):
            self.grad_in_hooks.append((torch.is_grad_enabled(), torch.is_inference_mode_enabled()))

        def on_test_end(self):
            self.grad_in_hooks.append((torch.is_grad_enabled(), torch.is_inference_mode_enabled()))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    return Body()


def _both(**kw):
    """(Lightning's trainer, Tandem's trainer) built with the same options."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pl.Trainer(accelerator="cpu", **kw), Trainer(**kw)


def _fit_val_at(**kw) -> list[list[tuple[int, int]]]:
    seen = []
    for trainer, base in zip(_both(num_sanity_val_steps=0, **QUIET, **kw), (pl.LightningModule, Task)):
        task = _body(base)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(task, _data(), _data(8))
        seen.append(task.val_at)
    return seen


@pytest.mark.parametrize(
    "kw",
    [
        dict(max_epochs=1, val_check_interval=0.5),  # 5 batches: every 2, not again at the epoch's end
        dict(max_epochs=1, val_check_interval=2),
        dict(max_epochs=1, val_check_interval=1.0),
        dict(max_epochs=2, check_val_every_n_epoch=2, val_check_interval=0.5),
        dict(max_epochs=2, val_check_interval=5),
        dict(max_epochs=1, val_check_interval=0.2),
    ],
    ids=["half", "every-2", "epoch", "gated", "every-5", "fifth"],
)
def test_validation_moments_equal_lightnings(kw):
    lightning, tandem = _fit_val_at(**kw)
    assert tandem == lightning


def test_val_check_interval_beyond_the_epoch_is_refused_as_lightning_does():
    for trainer, base in zip(
        _both(max_epochs=1, val_check_interval=100, **QUIET), (pl.LightningModule, Task)
    ):
        with pytest.raises(ValueError), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(_body(base), _data(), _data(8))


def test_fraction_with_check_val_every_n_epoch_none_is_refused():
    with pytest.raises(pl.utilities.exceptions.MisconfigurationException):
        pl.Trainer(val_check_interval=0.5, check_val_every_n_epoch=None)
    with pytest.raises(ConfigError, match="check_val_every_n_epoch=None"):
        Trainer(val_check_interval=0.5, check_val_every_n_epoch=None)
    Trainer(val_check_interval=3, check_val_every_n_epoch=None)  # an int counts batches: accepted


@pytest.mark.parametrize(
    "name", ["limit_train_batches", "limit_test_batches", "overfit_batches", "val_check_interval"]
)
@pytest.mark.parametrize("value", [1, 1.0, 2, "default"])
def test_explicit_one_is_explained_as_lightning_does(caplog, monkeypatch, name, value):
    # Lightning stops its logger propagating when it is imported before logging has a handler, and other
    # test files quieten it: both undone for this test
    monkeypatch.setattr(logging.getLogger("pytorch_lightning"), "propagate", True)
    caplog.set_level(logging.INFO, logger="pytorch_lightning")
    kw = {} if value == "default" else {name: value}
    said = []
    for make in (lambda: pl.Trainer(accelerator="cpu", **kw), lambda: Trainer(**kw)):
        caplog.clear()
        with caplog.at_level(logging.INFO), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            make()
        marks = ("configured so 1 batch", "configured so 100%", "configured so validation will run")
        said.append([m for m in marks if m in caplog.text])
    assert said[1] == said[0]
    assert len(said[0]) == (value in (1, 1.0))


@mock.patch.dict(os.environ, {"PL_TRAINER_LOGGER": "False", "PL_TRAINER_MAX_STEPS": "7"})
def test_pl_trainer_environment_gives_defaults():
    lightning, tandem = _both()
    assert (tandem.logger, tandem.max_steps) == (lightning.logger, lightning.max_steps) == (None, 7)
    lightning, tandem = _both(max_steps=42, logger=False)  # an option passed wins
    assert tandem.max_steps == lightning.max_steps == 42


def test_max_epochs_reads_none_until_fit_picks_it():
    lightning, tandem = _both(max_steps=2, **QUIET)
    assert tandem.max_epochs is lightning.max_epochs is None
    for trainer, base in zip((lightning, tandem), (pl.LightningModule, Task)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(_body(base), _data())
    assert tandem.max_epochs == lightning.max_epochs == -1


def test_unset_max_epochs_warns_when_fit_starts():
    trainer = Trainer(limit_train_batches=1, **QUIET)
    assert trainer.max_epochs is None

    class Stop(Task):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(3, 1)

        def training_step(self, batch, batch_idx):
            self.trainer.should_stop = True
            return self.net(batch[0]).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    with pytest.warns(PossibleUserWarning, match="max_epochs"):
        trainer.fit(Stop(), _data())
    assert trainer.max_epochs == 1000 and trainer.current_epoch == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error", PossibleUserWarning)
        Trainer(fast_dev_run=True)


@pytest.mark.parametrize(
    "kw",
    [
        dict(enable_checkpointing=True),
        dict(logger=True),
        dict(enable_progress_bar=True),
        dict(log_every_n_steps=1),
        dict(num_sanity_val_steps=1),
        dict(fast_dev_run=1),
        dict(detect_anomaly=True),
        dict(profiler="simple"),
    ],
)
def test_barebones_refuses_what_it_turns_off(kw):
    with pytest.raises(ValueError):
        pl.Trainer(barebones=True, **kw)
    with pytest.raises(ConfigError, match="barebones"):
        Trainer(barebones=True, **kw)


def test_barebones_turns_logging_steps_off_and_says_so(caplog):
    with caplog.at_level(logging.INFO):
        trainer = Trainer(barebones=True, logger=False, enable_checkpointing=False)
    assert "Trainer(barebones=True)` mode" in caplog.text
    assert trainer.log_every_n_steps == 0 and trainer.num_sanity_val_steps == 0 and not trainer.loggers


def test_barebones_self_log_is_an_error():
    """A deliberate difference (docs/porting.md): Lightning warns and drops the value; Tandem refuses it."""
    task = _body(Task)
    task._trainer = Trainer(barebones=True)
    with pytest.raises(TaskError, match="barebones"):
        task.log("foo", 1.0)


def test_fast_dev_run_hands_a_dummy_logger_when_a_logger_was_given(tmp_path):
    from trainer.loggers import TensorBoardLogger

    trainer = Trainer(fast_dev_run=2, logger=TensorBoardLogger(str(tmp_path)), default_root_dir=str(tmp_path))
    assert isinstance(trainer.logger, DummyLogger)
    assert Trainer(fast_dev_run=True, logger=False).logger is None
    seen = []

    class Uses(Task):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(3, 1)

        def training_step(self, batch, batch_idx):
            self.logger.experiment.add_histogram("w", self.net.weight)  # what a user's step does
            seen.append(batch_idx)
            return self.net(batch[0]).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    trainer.fit(Uses(), _data())
    assert seen == [0, 1] and trainer.max_epochs == 1 and trainer.check_val_every_n_epoch == 1
    assert not os.path.exists(os.path.join(str(tmp_path), "lightning_logs"))


def test_overfit_batches_reads_every_loader_in_order_with_a_warning():
    class Ordered(torch.utils.data.Sampler):
        def __init__(self, n):
            self.n = n

        def __iter__(self):
            return iter(range(self.n))

        def __len__(self):
            return self.n

    for trainer, base in zip(_both(max_epochs=1, overfit_batches=2, **QUIET), (pl.LightningModule, Task)):
        train, val = _data(sampler=Ordered(20)), _data(8, sampler=RandomSampler(range(8)))
        with pytest.warns(UserWarning, match="overfit"):
            trainer.fit(_body(base), train, val)
        loaders = trainer.train_dataloader, trainer.val_dataloaders
        val_loader = loaders[1] if isinstance(loaders[1], DataLoader) else loaders[1][0]
        assert isinstance(loaders[0].sampler, SequentialSampler) and isinstance(
            val_loader.sampler, SequentialSampler
        )


def test_a_step_set_to_none_turns_validation_off_as_in_lightning():
    counts = []
    for trainer, base in zip(_both(max_epochs=1, **QUIET), (pl.LightningModule, Task)):
        task = _body(base)
        task.validation_step = None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(task, _data(), _data(8))
        counts.append((trainer.num_val_batches, task.val_at))
    assert counts[1] == counts[0] == ([], [])


@pytest.mark.parametrize("inference_mode", [True, False])
def test_evaluation_hooks_run_without_gradients(inference_mode):
    seen = []
    for trainer, base in zip(_both(inference_mode=inference_mode, **QUIET), (pl.LightningModule, Task)):
        task = _body(base)
        trainer.test(task, _data(8), verbose=False)
        seen.append(task.grad_in_hooks)
    assert seen[1] == seen[0] == [(False, inference_mode)] * 2


def test_strategy_connect_attaches_the_task():
    strategy, task = SingleDeviceStrategy(), _body(Task)
    assert strategy.lightning_module is None
    strategy.connect(task)
    assert strategy.lightning_module is task
    trainer = Trainer(max_steps=1, **QUIET)
    trainer.fit(task, _data())
    assert trainer.strategy.lightning_module is task


def test_pass_through_profiler_profiles_nothing():
    from trainer.profiler import PassThroughProfiler

    trainer = Trainer(max_steps=1, profiler=PassThroughProfiler(), **QUIET)
    assert trainer.profiler is None  # the loop times no section
    trainer.fit(_body(Task), _data())
    assert trainer.global_step == 1
    with pytest.raises(ConfigError, match="barebones"):
        Trainer(barebones=True, profiler=PassThroughProfiler())
    with pytest.raises(ValueError):
        pl.Trainer(barebones=True, profiler=pl.profilers.PassThroughProfiler())


def test_a_compiled_default_step_stays_off():
    """Trainer(compile=True) sets compiled copies of the step methods on the task; the default (no-op)
    validation_step among them does not turn validation on."""
    from tandem_core.hooks import overrides

    task = _body(Task)
    del type(task).validation_step  # this task defines no validation_step: Task's default is left
    task.validation_step = torch.compiler.disable(task.validation_step)
    task.test_step = torch.compile(task.test_step)
    assert not overrides(task, "validation_step") and overrides(task, "test_step")
