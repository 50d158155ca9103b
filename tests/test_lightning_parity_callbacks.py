"""Callbacks, checkpointing and the tuner as Lightning's own tests expect them (issue 36): each scenario runs
under Tandem and, where it can, under Lightning itself (pytorch_lightning 2.6.6) for comparison. ModelCheckpoint's
save points and files: tests/test_lightning_parity_checkpoint.py."""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch
from helpers.parity_callbacks import (
    QUIET,
)
from helpers.parity_callbacks import (
    Calls as _Calls,
)
from helpers.parity_callbacks import (
    LightningCalls as _LightningCalls,
)
from helpers.parity_callbacks import (
    loader as _loader,
)
from torch.utils.data import DataLoader, TensorDataset

from callbacks import ModelCheckpoint
from trainer import Trainer

pl = pytest.importorskip("pytorch_lightning")


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

    class TwoLoaders(_Calls):  # several loaders: the step takes dataloader_idx (else an error, as Lightning)
        def validation_step(self, batch, batch_idx, dataloader_idx=0):
            return super().validation_step(batch, batch_idx)

    trainer = Trainer(max_steps=1, default_root_dir=tmp_path, **QUIET)
    trainer.validate(TwoLoaders(), dataloaders={"a": one, "b": two})
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
