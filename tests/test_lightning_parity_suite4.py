"""Public behaviour found by Lightning's suite in issue 43's third round (trainer/test_trainer.py,
trainer/test_dataloaders.py, trainer/properties, utilities/test_compile.py), each compared with Lightning itself on
the same script."""

from __future__ import annotations

import argparse
import logging
import warnings
from typing import Any

import pytest
import torch
from helpers.lightning_pair import QUIET
from helpers.lightning_pair import pair_trainer as _trainer
from torch.utils.data import DataLoader

pl = pytest.importorskip("pytorch_lightning")
from pytorch_lightning.demos import boring_classes as plb  # noqa: E402

from trainer import Trainer, demos  # noqa: E402


def _boring(lightning: bool) -> type:
    return plb.BoringModel if lightning else demos.BoringModel


def _errors(lightning: bool, tmp_path: Any) -> list[str]:
    """The exception classes Lightning's test_trainer.py awaits: their TypeError / AttributeError nature."""
    out = []
    cases = [
        lambda: _trainer(lightning, tmp_path).fit(torch.nn.Linear(2, 2)),
        lambda: _trainer(lightning, tmp_path).validate(),
        lambda: _trainer(lightning, tmp_path, gradient_clip_val=(1, 2)),
        lambda: (pl.Trainer if lightning else Trainer)(abcdefg=1),
        lambda: _trainer(lightning, tmp_path).save_checkpoint(str(tmp_path / "x.ckpt")),
    ]
    for case in cases:
        with pytest.raises(Exception) as raised:
            case()
        out.append(
            "TypeError" if isinstance(raised.value, TypeError) else
            "AttributeError" if isinstance(raised.value, AttributeError) else type(raised.value).__name__
        )  # fmt: skip
    return out


def test_wrong_inputs_raise_lightnings_exception_kinds(tmp_path):
    assert _errors(False, tmp_path) == _errors(True, tmp_path) == ["TypeError"] * 4 + ["AttributeError"]


def _readback(lightning: bool, tmp_path: Any, monkeypatch: Any) -> tuple[Any, ...]:
    from omegaconf import OmegaConf

    monkeypatch.setenv("HOME", str(tmp_path))
    t = (pl.Trainer if lightning else Trainer)(default_root_dir="~/runs", fast_dev_run=1, **QUIET)
    cfg = OmegaConf.create({"max_epochs": 1, "devices": 2, "accelerator": "cpu", "num_nodes": 1})
    t2 = (pl.Trainer if lightning else Trainer)(**cfg, **QUIET)
    return t.fast_dev_run, t.default_root_dir, t2.num_devices


def test_fast_dev_run_home_dir_and_omegaconf_options_read_back_as_lightnings(tmp_path, monkeypatch):
    ours, theirs = _readback(False, tmp_path, monkeypatch), _readback(True, tmp_path, monkeypatch)
    assert ours == theirs and ours[0] is True and ours[1] == str(tmp_path / "runs")


def _reloads(lightning: bool, tmp_path: Any, sanity: int, every: int, reload: int) -> tuple[list[int], ...]:
    """trainer/test_dataloaders.py::test_dataloaders_load_every_n_epochs_infrequent_val's script."""
    train, val, steps = [], [], []

    class Task(_boring(lightning)):  # type: ignore[misc,valid-type]
        def train_dataloader(self) -> Any:
            train.append(self.current_epoch)
            return super().train_dataloader()

        def val_dataloader(self) -> Any:
            val.append((self.trainer.sanity_checking, self.current_epoch))
            return super().val_dataloader()

        def validation_step(self, *args: Any) -> Any:
            steps.append(self.current_epoch)
            return super().validation_step(*args)

    trainer = _trainer(
        lightning, tmp_path, limit_train_batches=1, limit_val_batches=1, max_epochs=6,
        check_val_every_n_epoch=every, reload_dataloaders_every_n_epochs=reload, num_sanity_val_steps=sanity,
    )  # fmt: skip
    trainer.fit(Task())
    return train, val, steps


@pytest.mark.parametrize(("sanity", "every", "reload"), [(0, 3, 4), (1, 2, 1), (1, 1, 2), (0, 2, 0)])
def test_validation_loaders_are_asked_for_at_lightnings_epochs(tmp_path, sanity, every, reload):
    assert _reloads(False, tmp_path, sanity, every, reload) == _reloads(True, tmp_path, sanity, every, reload)


class _NoLen:
    """A loader whose __len__ raises NotImplementedError (Lightning reads it as a loader without length)."""

    def __init__(self, loader: DataLoader) -> None:
        self.loader = loader

    def __iter__(self) -> Any:
        return iter(self.loader)

    def __len__(self) -> int:
        raise NotImplementedError


def _predict(lightning: bool, tmp_path: Any) -> tuple[Any, ...]:
    class Task(_boring(lightning)):  # type: ignore[misc,valid-type]
        def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Any:
            return None if batch_idx % 2 else super().predict_step(batch, batch_idx)

    loader = DataLoader(plb.RandomDataset(32, 4))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        preds = _trainer(lightning, tmp_path).predict(Task(), _NoLen(loader), return_predictions=None)
    trainer = _trainer(lightning, tmp_path, max_steps=2, limit_val_batches=0)
    trainer.fit(_boring(lightning)(), _NoLen(loader))
    nones = any("predict" in str(w.message) and "None" in str(w.message) for w in seen)
    return [p is None for p in preds], nones, trainer.global_step, trainer.num_training_batches


def test_predictions_returned_by_default_a_none_output_warned_and_a_loader_whose_len_raises(tmp_path):
    assert _predict(False, tmp_path) == _predict(True, tmp_path) == ([False, True] * 2, True, 2, float("inf"))


def _stage_metrics(lightning: bool, tmp_path: Any) -> list[tuple[dict, dict]]:
    """trainer/test_trainer.py::test_trainer_metrics_reset_before_each_task's script, and the warning of
    test_warning_with_small_dataloader_and_logging_interval."""
    seen = []
    Callback = pl.Callback if lightning else __import__("callbacks").Callback

    class Look(Callback):  # type: ignore[misc,valid-type]
        def on_test_start(self, trainer: Any, *args: Any) -> None:
            seen.append((dict(trainer.callback_metrics), dict(trainer.logged_metrics)))

    class Task(_boring(lightning)):  # type: ignore[misc,valid-type]
        def training_step(self, *args: Any) -> Any:
            self.log("train_m", 7.0)
            return super().training_step(*args)

        def test_step(self, *args: Any) -> Any:
            self.log("test_m", 3.0)
            return super().test_step(*args)

    from pytorch_lightning.loggers import CSVLogger as PLCSV

    from trainer.loggers import CSVLogger

    logger = (PLCSV if lightning else CSVLogger)(tmp_path / f"csv{lightning}")
    logger.log_hyperparams(argparse.Namespace(a=1))  # a Namespace, as Lightning's loggers take
    trainer = _trainer(lightning, tmp_path, max_epochs=1, limit_train_batches=3, limit_val_batches=1,
                       limit_test_batches=1, log_every_n_steps=5, callbacks=[Look()], logger=logger)  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        task = Task()
        trainer.fit(task)
    trainer.test(task, verbose=False)
    short = [w for w in caught if "(3) is smaller than the logging interval" in str(w.message)]
    return [*seen, len(short) == 1, issubclass(short[0].category, UserWarning)]


def test_each_stage_starts_without_an_earlier_stages_metrics(tmp_path):
    assert _stage_metrics(False, tmp_path) == _stage_metrics(True, tmp_path) == [({}, {}), True, True]


def test_parallel_devices_is_settable_as_in_lightning():
    """trainer/properties/test_estimated_stepping_batches.py::test_num_stepping_batches_gpu assigns it."""
    from strategies import DDPStrategy

    devices = [torch.device("cpu", i) for i in range(3)]
    out = []
    for strategy in (pl.strategies.DDPStrategy(), DDPStrategy()):
        strategy.parallel_devices = devices
        out.append((strategy.parallel_devices, strategy.num_processes))
    assert out[0] == out[1] == (devices, 3)


def _compiled(lightning: bool) -> tuple[Any, ...]:
    if lightning:
        from pytorch_lightning.utilities.compile import from_compiled, to_uncompiled
    else:
        from trainer.utilities import from_compiled, to_uncompiled
    task = _boring(lightning)()
    plain = task.forward
    compiled = from_compiled(torch.compile(task, backend="eager"))
    names = ("forward", "training_step", "validation_step", "test_step", "predict_step")
    wrapped = [hasattr(getattr(compiled, n), "_torchdynamo_orig_callable") for n in names]
    back = to_uncompiled(compiled)
    with pytest.raises(ValueError):
        to_uncompiled(back)
    with pytest.raises(ValueError):
        from_compiled(task)
    return compiled is task, wrapped, back is task, back.forward == plain, back._compiler_ctx


def test_from_compiled_and_to_uncompiled_as_lightnings():
    assert _compiled(False) == _compiled(True) == (True, [True] * 5, True, True, None)


def test_a_from_compiled_task_fits_and_comes_back_compiled(tmp_path, caplog):
    """Tandem's side of a from_compiled task in fit: set up plain, compiled again for the stage, handed back as
    given (Lightning keeps the compiled methods too); and the min_epochs note of
    test_trainer_min_steps_and_min_epochs_not_reached, said once at INFO (Tandem leaves logging levels to the
    application: the test's capture of Lightning's own logger does not see it)."""
    from callbacks import EarlyStopping
    from trainer.utilities import from_compiled

    class Task(demos.BoringModel):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            out = super().training_step(batch, batch_idx)
            self.log("loss", out["loss"] * 0.0)
            return out

    task = from_compiled(torch.compile(Task(), backend="eager"))
    stop = EarlyStopping(monitor="loss", patience=0, check_on_train_epoch_end=True)
    trainer = _trainer(
        False, tmp_path, min_epochs=3, limit_train_batches=2, limit_val_batches=0, callbacks=[stop]
    )
    with caplog.at_level(logging.INFO, logger="trainer"):
        trainer.fit(task)
    assert trainer.current_epoch == 3
    assert hasattr(task.training_step, "_torchdynamo_orig_callable") and task._compiler_ctx is not None
    assert sum("min_epochs=3" in r.getMessage() for r in caplog.records) == 1


def _on_exception(lightning: bool, tmp_path: Any, kind: type[BaseException]) -> tuple[list[str], list[str]]:
    """test_trainer_calls_strategy_on_exception / _datamodule_on_exception: the strategy's hook, and a DataModule's
    on_exception set on the instance as a Mock, each called once with the error."""
    from unittest import mock

    from strategies.base import Strategy

    error = kind("boom")

    class Task(_boring(lightning)):  # type: ignore[misc,valid-type]
        def on_fit_start(self) -> None:
            raise error

    dm = (plb.BoringDataModule if lightning else demos.BoringDataModule)()
    dm.on_exception = mock.Mock()
    owner = pl.strategies.Strategy if lightning else Strategy
    with mock.patch.object(owner, "on_exception") as hook, pytest.raises((kind, SystemExit)):
        _trainer(lightning, tmp_path).fit(Task(), datamodule=dm)
    names = [type(c.args[0]).__name__ for c in hook.call_args_list]
    return names, [type(c.args[0]).__name__ for c in dm.on_exception.call_args_list]


@pytest.mark.parametrize("kind", [RuntimeError, KeyboardInterrupt])
def test_the_strategy_and_a_mocked_datamodule_hook_get_the_exception(tmp_path, kind):
    import signal

    before = signal.getsignal(signal.SIGINT)
    ours = _on_exception(False, tmp_path, kind)
    theirs = _on_exception(True, tmp_path, kind)
    signal.signal(signal.SIGINT, before)  # Lightning leaves SIGINT ignored after a KeyboardInterrupt
    assert ours == theirs == ([kind.__name__], [kind.__name__])
