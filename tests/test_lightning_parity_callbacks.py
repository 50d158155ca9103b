"""Callbacks, checkpointing and the tuner as Lightning's own tests expect them (issue 36): each scenario runs
under Tandem and, where it can, under Lightning itself (pytorch_lightning 2.6.6) for comparison."""

from __future__ import annotations

import inspect
import os
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from callbacks import ModelCheckpoint
from trainer import Task, Trainer

pl = pytest.importorskip("pytorch_lightning")
QUIET = dict(enable_progress_bar=False, enable_model_summary=False, logger=False, num_sanity_val_steps=0)


def _loader(n: int) -> DataLoader:
    return DataLoader(TensorDataset(torch.randn(n, 2)), batch_size=1)


class _Calls(Task):
    """Records (epoch, batches done in the epoch) at each validation inside fit."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.calls: list[tuple[int, int]] = []
        self.done = 0

    def training_step(self, batch, batch_idx):
        self.done = batch_idx + 1
        return self.layer(batch[0]).sum()

    def validation_step(self, batch, batch_idx):
        pass

    def on_validation_start(self) -> None:
        self.calls.append((self.current_epoch, self.done))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return _loader(5)

    def val_dataloader(self):
        return _loader(2)


class _LightningCalls(pl.LightningModule):
    training_step, validation_step, configure_optimizers = (
        _Calls.training_step,
        _Calls.validation_step,
        _Calls.configure_optimizers,
    )
    on_validation_start, train_dataloader, val_dataloader = (
        _Calls.on_validation_start,
        _Calls.train_dataloader,
        _Calls.val_dataloader,
    )

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.calls: list[tuple[int, int]] = []
        self.done = 0


@pytest.mark.parametrize("interval", [1.0, 0.5, 2, 3, 0.2])
def test_val_check_interval_that_does_not_divide_the_epoch_skips_its_end(tmp_path, interval):
    """0.5 of 5 batches validates after batches 2 and 4 only, not again at the epoch's end (Lightning)."""
    ours = _Calls()
    Trainer(max_epochs=2, val_check_interval=interval, default_root_dir=tmp_path, **QUIET).fit(ours)
    theirs = _LightningCalls()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pl.Trainer(
            max_epochs=2, val_check_interval=interval, default_root_dir=tmp_path, accelerator="cpu", **QUIET
        ).fit(theirs)
    assert ours.calls == theirs.calls
    assert len(ours.calls) == {1.0: 2, 0.5: 4, 2: 4, 3: 2, 0.2: 10}[interval]


def test_model_checkpoint_signature_annotations_are_objects():
    """argument parsers built from the signature (jsonargparse, as Lightning's CLI) see types, not strings."""
    jsonargparse = pytest.importorskip("jsonargparse")
    ours = inspect.signature(ModelCheckpoint).parameters["save_last"].annotation
    theirs = inspect.signature(pl.callbacks.ModelCheckpoint).parameters["save_last"].annotation
    for value in ("yes", "false", "link"):
        results = []
        for annotation in (ours, theirs):
            parser = jsonargparse.ArgumentParser()
            parser.add_argument("--a", type=annotation)
            results.append(parser.parse_args(["--a", value]).a)
        assert results[0] == results[1] == {"yes": True, "false": False, "link": "link"}[value]


def test_a_hook_set_to_none_on_the_instance_is_switched_off(tmp_path):
    """`task.validation_step = None` (Lightning's idiom in its tests) means no validation, not a crash."""
    ours, theirs = _Calls(), _LightningCalls()
    ours.validation_step = None
    theirs.validation_step = None
    Trainer(max_epochs=1, default_root_dir=tmp_path, **QUIET).fit(ours)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pl.Trainer(max_epochs=1, default_root_dir=tmp_path, accelerator="cpu", **QUIET).fit(theirs)
    assert ours.calls == theirs.calls == []


def test_early_stopping_threshold_messages_name_the_reason(tmp_path):
    from callbacks import EarlyStopping
    from callbacks.early_stopping import EarlyStoppingReason

    stop = EarlyStopping(monitor="m", stopping_threshold=0.6)
    assert stop.evaluate(0.5)[0] and stop._why is EarlyStoppingReason.STOPPING_THRESHOLD
    assert "Stopping threshold reached" in stop.evaluate(0.5)[1]
    diverge = EarlyStopping(monitor="m", divergence_threshold=8.0)
    assert "Divergence threshold reached" in diverge.evaluate(9.0)[1]


def test_state_keys_of_subclasses_are_their_own_names_as_lightnings():
    from callbacks import EarlyStopping

    class MyStop(EarlyStopping):
        pass

    class MyCheckpoint(ModelCheckpoint):
        pass

    class TheirStop(pl.callbacks.EarlyStopping):
        pass

    class TheirCheckpoint(pl.callbacks.ModelCheckpoint):
        pass

    assert MyStop(monitor="a").state_key.replace("MyStop", "X") == TheirStop(monitor="a").state_key.replace(
        "TheirStop", "X"
    )
    mine = MyCheckpoint(monitor="a", every_n_epochs=2).state_key.replace("MyCheckpoint", "X")
    assert mine == TheirCheckpoint(monitor="a", every_n_epochs=2).state_key.replace("TheirCheckpoint", "X")


def test_pickled_callbacks_equal_the_original(tmp_path):
    import pickle

    from callbacks import EarlyStopping

    for cb in (EarlyStopping(monitor="foo"), ModelCheckpoint(dirpath=tmp_path, monitor="foo")):
        assert vars(pickle.loads(pickle.dumps(cb))) == vars(cb)


def test_resuming_past_max_epochs_is_refused(tmp_path):
    """A checkpoint at epoch 2 resumed with max_epochs=1: Lightning raises; Tandem too (it used to run nothing)."""
    from tandem_core.errors import ConfigError

    trainer = Trainer(max_epochs=2, default_root_dir=tmp_path, **QUIET)
    trainer.fit(_Calls())
    path = str(tmp_path / "end.ckpt")
    trainer.save_checkpoint(path)
    with pytest.raises(ConfigError, match="max_epochs=1"):
        Trainer(max_epochs=1, default_root_dir=tmp_path, **QUIET).fit(_Calls(), ckpt_path=path)
    theirs = _LightningCalls()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lt = pl.Trainer(max_epochs=2, default_root_dir=tmp_path, accelerator="cpu", **QUIET)
        lt.fit(theirs)
        lt.save_checkpoint(str(tmp_path / "theirs.ckpt"))
        with pytest.raises(pl.utilities.exceptions.MisconfigurationException):
            pl.Trainer(max_epochs=1, default_root_dir=tmp_path, accelerator="cpu", **QUIET).fit(
                _LightningCalls(), ckpt_path=str(tmp_path / "theirs.ckpt")
            )


class _Scores(_Calls):
    """Logs the next of `scores` at each validation's end."""

    def __init__(self, scores: list[float]) -> None:
        super().__init__()
        self.scores = list(scores)

    def on_validation_epoch_end(self) -> None:
        self.log("auroc", self.scores.pop(0))

    def train_dataloader(self):
        return _loader(4)


class _LightningScores(_LightningCalls):
    on_validation_epoch_end, train_dataloader = _Scores.on_validation_epoch_end, _Scores.train_dataloader

    def __init__(self, scores: list[float]) -> None:
        super().__init__()
        self.scores = list(scores)


@pytest.mark.parametrize(
    ("trigger", "options"),
    [
        (dict(every_n_train_steps=1), dict(max_epochs=1, val_check_interval=0.5)),
        (dict(every_n_train_steps=3), dict(max_epochs=2, val_check_interval=0.5)),
        (dict(train_time_interval=0), dict(max_epochs=2, check_val_every_n_epoch=2)),
    ],
)
def test_step_saves_wait_for_the_validation_that_logs_the_monitored_key(tmp_path, trigger, options):
    """A step- or time-triggered save of a validation metric waits for the validation's end when the key is
    not logged yet, or when the epoch's last batch would save a stale value (Lightning 2.6)."""
    from datetime import timedelta

    if "train_time_interval" in trigger:
        trigger = dict(train_time_interval=timedelta(seconds=0))  # zero is an interval: every step
    scores = [0.1, 0.9, 0.5, 0.7]
    kw = dict(
        monitor="auroc", mode="max", save_top_k=-1, every_n_epochs=0, save_on_train_epoch_end=False, **trigger
    )
    ours = ModelCheckpoint(dirpath=tmp_path / "ours", **kw)
    Trainer(callbacks=[ours], default_root_dir=tmp_path, **QUIET, **options).fit(_Scores(scores))
    theirs = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "theirs", **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pl.Trainer(callbacks=[theirs], default_root_dir=tmp_path, accelerator="cpu", **QUIET, **options).fit(
            _LightningScores(scores)
        )
    assert sorted(os.listdir(tmp_path / "ours")) == sorted(os.listdir(tmp_path / "theirs"))
    assert {os.path.basename(p): round(float(v), 4) for p, v in ours.best_k_models.items()} == {
        os.path.basename(p): round(float(v), 4) for p, v in theirs.best_k_models.items()
    }
    assert float(ours.best_model_score) == pytest.approx(float(theirs.best_model_score))


def test_model_checkpoint_dirpath_expands_home_and_scores_are_tensors(tmp_path):
    from pathlib import Path

    assert (
        ModelCheckpoint(dirpath="~/ckpts").dirpath == pl.callbacks.ModelCheckpoint(dirpath="~/ckpts").dirpath
    )
    assert ModelCheckpoint(dirpath="~/ckpts").dirpath == str(Path.home() / "ckpts")
    assert ModelCheckpoint(dirpath="./~/c").dirpath == str(Path.cwd() / "~" / "c")
    cb = ModelCheckpoint(dirpath=tmp_path, monitor="x")
    cb.best_model_score = torch.tensor(2.5)  # assignable, as Lightning's attribute
    assert float(cb.best_model_score) == 2.5


class _StepScore(_Calls):
    def training_step(self, batch, batch_idx):
        self.log("score", torch.tensor(0.1 * (self.global_step + 1)))  # a float32 tensor, as self.log keeps
        return super().training_step(batch, batch_idx)


def test_current_score_equals_the_logged_float32_value(tmp_path):
    cb = ModelCheckpoint(dirpath=tmp_path, monitor="score", mode="max", every_n_train_steps=1)
    Trainer(max_steps=3, callbacks=[cb], default_root_dir=tmp_path, **QUIET).fit(_StepScore())
    assert cb.current_score == torch.tensor(0.3) and cb.current_score == 0.3  # not 0.30000001192092896


def test_the_checkpoint_resumed_from_is_not_deleted_from_the_top_k(tmp_path):
    """Resuming into the same directory: the file resumed from stays when it falls out of the top k."""
    kw = dict(dirpath=tmp_path, monitor="step", mode="max", save_top_k=2, every_n_train_steps=2)
    opts = dict(default_root_dir=tmp_path, limit_val_batches=0, **QUIET)
    task = _Calls()
    Trainer(max_steps=4, callbacks=[ModelCheckpoint(**kw)], **opts).fit(task)
    assert sorted(os.listdir(tmp_path)) == ["epoch=0-step=2.ckpt", "epoch=0-step=4.ckpt"]
    resume = str(tmp_path / "epoch=0-step=4.ckpt")
    Trainer(max_steps=8, callbacks=[ModelCheckpoint(**kw)], **opts).fit(_Calls(), ckpt_path=resume)
    assert sorted(os.listdir(tmp_path)) == [
        "epoch=0-step=4.ckpt",  # resumed from: kept (Lightning keeps it too); step 2 fell out
        "epoch=1-step=6.ckpt",
        "epoch=1-step=8.ckpt",
    ]


def test_a_fitted_trainer_pickles_and_loads_back(tmp_path):
    """torch.save(trainer) / torch.load(weights_only=False) after fit (Lightning's test_model_torch_save):
    unpickling the optimizer wrapper used to recurse without end."""
    trainer = Trainer(max_epochs=1, default_root_dir=tmp_path, **QUIET)
    trainer.fit(_Calls())
    torch.save(trainer.model, tmp_path / "model.pt")
    torch.save(trainer, tmp_path / "trainer.pt")
    again = torch.load(tmp_path / "trainer.pt", weights_only=False)
    assert again.global_step == trainer.global_step == 5


def test_timer_without_duration_has_no_remaining_time_and_logs_its_stop(tmp_path, caplog):
    import logging

    from callbacks import Timer

    assert Timer().time_remaining() is None is pl.callbacks.Timer().time_remaining()
    with caplog.at_level(logging.INFO):
        Trainer(max_epochs=100, callbacks=[Timer(duration=0)], default_root_dir=tmp_path, **QUIET).fit(
            _Calls()
        )
    assert "Time limit reached." in caplog.text  # logged (as Lightning), not only printed


def test_pruning_verbose_2_logs_each_parameter(tmp_path, caplog):
    import logging

    from callbacks import ModelPruning

    task = _Calls()
    prune = ModelPruning(
        "l1_unstructured", amount=0.5, parameters_to_prune=[(task.layer, "weight")], verbose=2
    )
    with caplog.at_level(logging.INFO):
        Trainer(max_epochs=1, callbacks=[prune], default_root_dir=tmp_path, **QUIET).fit(task)
    lines = [m for m in caplog.messages if m.startswith("Applied")]
    assert len(lines) == 2 and "to `Linear(in_features=2, out_features=1, bias=True).weight`" in lines[1]


def test_gradient_accumulation_scheduler_under_manual_optimization_is_a_runtime_error():
    from callbacks import GradientAccumulationScheduler
    from tandem_core.errors import TaskError

    task = _Calls()
    task.automatic_optimization = False
    with pytest.raises(RuntimeError) as ours:  # Lightning raises RuntimeError
        GradientAccumulationScheduler({1: 2}).on_train_start(Trainer(**QUIET), task)
    assert isinstance(ours.value, TaskError)
    theirs = _LightningCalls()
    theirs.automatic_optimization = False
    with pytest.raises(RuntimeError):
        pl.callbacks.GradientAccumulationScheduler({1: 2}).on_train_start(pl.Trainer(), theirs)


def test_resuming_without_a_stateful_callback_of_the_checkpoint_warns(tmp_path):
    kw = dict(default_root_dir=tmp_path, **QUIET)
    first = ModelCheckpoint(dirpath=tmp_path, monitor="epoch", mode="max")
    other = ModelCheckpoint(dirpath=tmp_path, monitor="step", mode="max")
    Trainer(max_steps=1, callbacks=[first, other], **kw).fit(_Calls())
    with pytest.warns(UserWarning, match=r"callbacks this Trainer does not have.*'monitor': 'epoch'"):
        Trainer(max_steps=2, callbacks=[other], **kw).fit(_Calls(), ckpt_path=first.best_model_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        warnings.filterwarnings("ignore", message=".*(does not have many workers|smaller than the logging)")
        Trainer(max_steps=3, callbacks=[other, first], **kw).fit(_Calls(), ckpt_path=other.best_model_path)


def test_mock_callbacks_receive_the_hooks_as_in_lightning(tmp_path):
    """Mock(spec=Callback) (users' own tests): every hook is called on it, as Lightning calls them."""
    from unittest.mock import Mock

    from callbacks import Callback

    cb = Mock(spec=Callback, state_key="m")
    Trainer(max_steps=1, callbacks=[cb], default_root_dir=tmp_path, enable_checkpointing=False, **QUIET).fit(
        _Calls()
    )
    called = [c[0] for c in cb.method_calls]
    assert {"on_fit_start", "on_train_batch_end", "on_fit_end"} <= set(called)


def test_evaluation_loaders_read_back_as_given(tmp_path):
    """trainer.val_dataloaders: the one loader given (not a list of it), a dict as a dict; None before."""
    one, two = _loader(2), _loader(3)
    trainer = Trainer(max_steps=1, default_root_dir=tmp_path, **QUIET)
    assert trainer.val_dataloaders is None
    trainer.fit(_Calls(), val_dataloaders=one)
    assert isinstance(trainer.val_dataloaders, DataLoader) and len(trainer.val_dataloaders) == 2
    trainer = Trainer(max_steps=1, default_root_dir=tmp_path, **QUIET)
    trainer.validate(_Calls(), dataloaders={"a": one, "b": two})
    shaped = trainer.val_dataloaders
    assert list(shaped) == ["a", "b"] and [len(dl) for dl in shaped.values()] == [2, 3]
    theirs = pl.Trainer(max_steps=1, default_root_dir=tmp_path, accelerator="cpu", **QUIET)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs.fit(_LightningCalls(), val_dataloaders=one)
    assert isinstance(theirs.val_dataloaders, DataLoader)


def test_scale_batch_size_and_swa_log_their_steps(tmp_path, caplog):
    import logging

    from callbacks import StochasticWeightAveraging
    from trainer import Tuner

    class Sized(_Calls):
        def __init__(self) -> None:
            super().__init__()
            self.batch_size = 2

        def train_dataloader(self):
            return DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=self.batch_size)

        def configure_optimizers(self):
            opt = torch.optim.SGD(self.parameters(), lr=0.1)
            return [opt], [torch.optim.lr_scheduler.StepLR(opt, 1)]

    with caplog.at_level(logging.INFO):
        Tuner(Trainer(max_epochs=1, default_root_dir=tmp_path, **QUIET)).scale_batch_size(
            Sized(), init_val=2, max_trials=4, steps_per_trial=1
        )
    assert caplog.text.count("trying batch size") == 2  # 2 -> 4 -> 8
    assert caplog.text.count("greater or equal than the length") == 1  # 8 covers the 8 samples
    caplog.clear()
    swa = StochasticWeightAveraging(swa_lrs=0.01, swa_epoch_start=1)
    with caplog.at_level(logging.INFO):
        Trainer(max_epochs=2, callbacks=[swa], default_root_dir=tmp_path, **QUIET).fit(Sized())
    assert "Swapping scheduler `StepLR` for `SWALR`" in caplog.text


def test_lr_find_without_a_learning_rate_field_is_an_attribute_error(tmp_path):
    from tandem_core.errors import ConfigError
    from trainer import Tuner

    with pytest.raises(AttributeError) as ours:  # Lightning's class; still a ConfigError (a TandemError)
        Tuner(Trainer(max_steps=2, default_root_dir=tmp_path, **QUIET)).lr_find(_Calls(), update_attr=True)
    assert isinstance(ours.value, ConfigError)
    with pytest.raises(AttributeError), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pl.tuner.Tuner(pl.Trainer(max_steps=2, default_root_dir=tmp_path, **QUIET)).lr_find(
            _LightningCalls(), update_attr=True
        )
