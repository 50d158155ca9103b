"""The Trainer's public read-back attributes and run state, compared with Lightning's on the same arguments
(issue 36: what Lightning's own tests read from a Trainer, a Task, EarlyStopping, ModelCheckpoint and loggers)."""

from __future__ import annotations

import logging
import math
import warnings

import pytest
import pytorch_lightning as pl
import pytorch_lightning.demos.boring_classes
import pytorch_lightning.loggers.logger
import torch
import yaml
from callback_tasks import QUIET, Scored, loader
from conftest import FAST

from callbacks import EarlyStopping, ModelCheckpoint
from callbacks.early_stopping import EarlyStoppingReason
from trainer import Task, Trainer
from trainer.demos import BoringModel
from trainer.loggers import DummyLogger
from trainer.states import TrainerFn, TrainerStatus

PL_QUIET = dict(
    logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False
)
OPTIONS = [
    {},
    {"fast_dev_run": True},
    {"fast_dev_run": 3},
    {"overfit_batches": 2},
    {
        "gradient_clip_val": 0.5,
        "limit_train_batches": 0.5,
        "num_sanity_val_steps": -1,
        "val_check_interval": 3,
        "check_val_every_n_epoch": None,
    },  # fmt: skip
    {"barebones": True, "log_every_n_steps": 0, "min_epochs": 2, "min_steps": 3, "limit_val_batches": 0},
    {"accelerator": "cpu", "devices": 2, "strategy": "ddp", "reload_dataloaders_every_n_epochs": 2},
]
READ_BACK = (
    "barebones check_val_every_n_epoch fast_dev_run gradient_clip_algorithm gradient_clip_val limit_train_batches "
    "limit_val_batches limit_test_batches limit_predict_batches log_every_n_steps min_epochs min_steps num_nodes "
    "num_sanity_val_steps overfit_batches reload_dataloaders_every_n_epochs val_check_interval device_ids "
    "num_devices node_rank enable_autolog_hparams early_stopping_callback scaler interrupted received_sigterm"
).split()


@pytest.fixture(autouse=True)
def _quiet_lightning():
    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


@pytest.mark.parametrize("kwargs", OPTIONS)
def test_every_option_reads_back_as_lightning(kwargs):
    if kwargs.get("barebones"):
        kwargs = {**kwargs, "enable_model_summary": False}
    theirs = pl.Trainer(**{**PL_QUIET, **kwargs})
    ours = Trainer(**{**PL_QUIET, **kwargs})
    for name in READ_BACK:
        assert getattr(ours, name) == getattr(theirs, name), name
    assert math.isinf(ours.num_sanity_val_steps) == (kwargs.get("num_sanity_val_steps") == -1)


def _fit_and_restore(tmp_path, module, trainer_cls, quiet):
    trainer = trainer_cls(max_steps=2, default_root_dir=str(tmp_path), **quiet)
    trainer.fit(module)
    path = str(tmp_path / "model.ckpt")
    trainer.save_checkpoint(path)
    assert trainer.ckpt_path is None  # fit started from nothing
    again = trainer_cls(default_root_dir=str(tmp_path), limit_val_batches=1, **quiet)
    again.validate(module, ckpt_path=path, verbose=False)
    read_after_validate = again.ckpt_path
    managed = trainer_cls(default_root_dir=str(tmp_path), limit_val_batches=1, **quiet)
    managed.ckpt_path = path  # stateful form: the next stage without ckpt_path restores it
    with torch.no_grad():
        for p in module.parameters():
            p.zero_()
    managed.validate(module, verbose=False)
    restored = [p.abs().sum().item() > 0 for p in module.parameters()]
    with pytest.warns(UserWarning, match="ckpt_path"):
        managed.validate(module, ckpt_path=path, verbose=False)
    return read_after_validate == path, managed.ckpt_path == path, all(restored)


def test_ckpt_path_as_lightning(tmp_path):
    theirs = _fit_and_restore(tmp_path / "pl", pl.demos.boring_classes.BoringModel(), pl.Trainer, PL_QUIET)
    ours = _fit_and_restore(
        tmp_path / "tandem", BoringModel(), Trainer, {**FAST, "enable_checkpointing": False}
    )
    assert ours == theirs == (True, True, True)


class Fails(BoringModel):
    def training_step(self, batch, batch_idx):
        raise ValueError("boom")


def _state(trainer_cls, module, failing, quiet):
    trainer = trainer_cls(max_steps=1, **quiet)
    with pytest.raises(ValueError) if failing else warnings.catch_warnings():
        trainer.fit(module)
    s = trainer.state
    return s.fn == "fit", s.status.value, s.finished, s.stopped, trainer.interrupted


@pytest.mark.parametrize("failing", [False, True])
def test_state_fn_status_and_interrupted_as_lightning(failing, tmp_path):
    pl_module = type("F", (pl.demos.boring_classes.BoringModel,), {"training_step": Fails.training_step})
    theirs = _state(pl.Trainer, pl_module() if failing else pl.demos.boring_classes.BoringModel(), failing,
                    {**PL_QUIET, "default_root_dir": str(tmp_path)})  # fmt: skip
    ours = _state(Trainer, Fails() if failing else BoringModel(), failing,
                  {**FAST, "enable_checkpointing": False, "default_root_dir": str(tmp_path)})  # fmt: skip
    assert ours == theirs
    assert TrainerFn.FITTING == "fit" and TrainerStatus.FINISHED == "finished"


class Outer(Task):
    def __init__(self):
        super().__init__()
        self.inner = BoringModel()


def test_task_trainer_is_settable_and_reaches_nested_tasks():
    theirs = pl.LightningModule()
    with pytest.raises(RuntimeError, match="not attached to a `Trainer`"):
        theirs.trainer  # noqa: B018
    task, trainer = Outer(), Trainer(**FAST)
    with pytest.raises(RuntimeError, match="not attached to a `Trainer`"):
        task.trainer  # noqa: B018
    task.trainer = trainer
    assert task.trainer is trainer and task.inner.trainer is trainer
    task.trainer = None
    with pytest.raises(RuntimeError):
        task.inner.trainer  # noqa: B018


SCORES = {  # (scores, kwargs) -> the reason Lightning gives
    "patience": ([5, 6, 7, 8], {"patience": 2}),
    "threshold": ([5, 4, 0.5, 0.1], {"stopping_threshold": 1.0}),
    "divergence": ([5, 4, 50, 1], {"divergence_threshold": 10.0}),
    "non_finite": ([5, math.nan, 4, 3], {}),
    "none": ([5, 4, 3, 2], {"patience": 3}),
}


def _lightning_reason(scores, kwargs):
    es = pl.callbacks.EarlyStopping("val/score", **kwargs)
    for value in scores:
        stop, _ = es._evaluate_stopping_criteria(torch.tensor(float(value)))  # the reference's own decision
        if stop:
            break
    return es.stopping_reason.name


@pytest.mark.parametrize("case", sorted(SCORES))
def test_early_stopping_reason_as_lightning(case):
    scores, kwargs = SCORES[case]
    es = EarlyStopping("val/score", **kwargs)
    trainer = Trainer(max_epochs=len(scores), callbacks=[es], **{**QUIET, "enable_checkpointing": False})
    trainer.fit(Scored(scores), loader(), loader(2, 2))
    assert es.stopping_reason.name == _lightning_reason(scores, kwargs)
    assert (es.stopping_reason == EarlyStoppingReason.NOT_STOPPED) == (es.stopping_reason_message is None)
    restored = EarlyStopping("val/score")
    restored.load_state_dict(es.state_dict())
    assert (restored.stopping_reason, restored.stopping_reason_message) == (
        es.stopping_reason, es.stopping_reason_message)  # fmt: skip


def test_dummy_logger_as_lightning():
    theirs, ours = pl.loggers.logger.DummyLogger(), DummyLogger()
    for logger in (theirs, ours):
        assert (logger.name, logger.version, logger[0]) == ("", "", logger)
        assert logger.experiment.add_image("x", 1) is None and logger.experiment[3] is logger.experiment
        assert logger.log_metrics({"a": 1.0}, step=0) is None and logger.anything_at_all(1, k=2) is None


def test_model_checkpoint_to_yaml_as_lightning(tmp_path):
    scores = {str(tmp_path / "a.ckpt"): 0.5, str(tmp_path / "b.ckpt"): 0.25}
    (tmp_path / "pl").mkdir()
    theirs = pl.callbacks.ModelCheckpoint(dirpath=str(tmp_path / "pl"))
    theirs.best_k_models = {k: torch.tensor(v) for k, v in scores.items()}
    theirs.to_yaml()
    ours = ModelCheckpoint(dirpath=str(tmp_path / "tandem"))
    ours.best_k_models = dict(scores)
    ours.to_yaml()
    ours.to_yaml(tmp_path / "elsewhere.yaml")
    expected = yaml.safe_load((tmp_path / "pl" / "best_k_models.yaml").read_text())
    assert yaml.safe_load((tmp_path / "tandem" / "best_k_models.yaml").read_text()) == expected == scores
    assert yaml.safe_load((tmp_path / "elsewhere.yaml").read_text()) == scores
