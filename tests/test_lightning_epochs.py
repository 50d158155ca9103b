"""Lightning's epoch counter at the end of a fit that stops inside an epoch (issue 36), against Lightning itself."""

from __future__ import annotations

import logging
import warnings

import pytest
import pytorch_lightning as pl
import pytorch_lightning.demos.boring_classes
import torch

from callbacks import Callback
from trainer import Trainer
from trainer.demos import BoringModel, ManualOptimBoringModel

QUIET = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)


@pytest.fixture(autouse=True)
def _quiet_lightning():
    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _recorder(base):
    class Record(base):
        def __init__(self):
            self.seen = {}

        def on_train_end(self, trainer, module):
            self.seen["on_train_end"] = trainer.current_epoch

        def on_fit_end(self, trainer, module):
            self.seen["on_fit_end"] = trainer.current_epoch

    return Record()


def _run(trainer_cls, module, callback_base, tmp_path, **kwargs):
    rec = _recorder(callback_base)
    trainer = trainer_cls(
        callbacks=[rec], limit_val_batches=0, default_root_dir=str(tmp_path), **QUIET, **kwargs
    )
    trainer.fit(module)
    path = str(tmp_path / "after.ckpt")
    trainer.save_checkpoint(path)
    rec.seen["checkpoint"] = torch.load(path, weights_only=False)["epoch"]
    rec.seen["after"] = trainer.current_epoch
    return rec.seen


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_steps": 3, "limit_train_batches": 8},  # stops inside epoch 0
        {"max_steps": 11, "limit_train_batches": 4, "max_epochs": 5},  # inside epoch 2
    ],
)
def test_current_epoch_after_a_stop_inside_an_epoch_is_lightnings(kwargs, tmp_path):
    theirs = _run(pl.Trainer, pl.demos.boring_classes.BoringModel(), pl.Callback, tmp_path / "pl", **kwargs)
    ours = _run(Trainer, BoringModel(), Callback, tmp_path / "tandem", **kwargs)
    assert ours == theirs


class Batches(BoringModel):
    def __init__(self):
        super().__init__()
        self.seen = []

    def training_step(self, batch, batch_idx):
        self.seen.append((self.current_epoch, batch_idx))
        return super().training_step(batch, batch_idx)


def test_a_checkpoint_saved_after_such_a_stop_resumes_inside_the_epoch(tmp_path):
    """Tandem's deliberate difference (docs/porting.md): the resume continues the cut epoch where it stopped."""
    first = Trainer(max_steps=3, limit_train_batches=8, limit_val_batches=0, **QUIET)
    first.fit(Batches())
    assert first.current_epoch == 1
    first.save_checkpoint(str(tmp_path / "a.ckpt"))
    task = Batches()
    Trainer(max_steps=5, limit_train_batches=8, limit_val_batches=0, **QUIET).fit(
        task, ckpt_path=str(tmp_path / "a.ckpt")
    )
    assert task.seen == [(0, 3), (0, 4)]


def _manual_outputs(trainer_cls, module_cls, callback_base):
    class Record(callback_base):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            self.outputs = outputs

    class Returns(module_cls):
        def __init__(self, form):
            super().__init__()
            self.form = form

        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            return {"tensor": loss, "dict": {"loss": loss, "extra": loss * 2}, "none": None}[self.form]

    seen = {}
    for form in ("tensor", "dict", "none"):
        rec = Record()
        trainer_cls(max_steps=1, limit_val_batches=0, callbacks=[rec], **QUIET).fit(Returns(form))
        seen[form] = {k: (type(v).__name__, v.grad_fn is not None) for k, v in rec.outputs.items()}
    return seen


def test_manual_optimization_batch_end_outputs_are_lightnings():
    """Always a dict; "loss" detached (already backpropagated by the task); other keys as returned."""
    theirs = _manual_outputs(pl.Trainer, pl.demos.boring_classes.ManualOptimBoringModel, pl.Callback)
    ours = _manual_outputs(Trainer, ManualOptimBoringModel, Callback)
    assert ours == theirs


def _epochs_seen(trainer_cls, module_cls, callback_base, ckpt_cls, tmp_path):
    class Record(callback_base):
        def __init__(self):
            self.seen = []

        def on_sanity_check_start(self, trainer, module):
            self.seen.append(("sanity", trainer.current_epoch))

        def on_train_epoch_start(self, trainer, module):
            self.seen.append(("train", trainer.current_epoch))

    quiet = {**QUIET, "enable_checkpointing": True}
    ckpt = ckpt_cls(dirpath=str(tmp_path))
    trainer_cls(max_epochs=1, limit_train_batches=2, limit_val_batches=1, callbacks=[ckpt], num_sanity_val_steps=0,
                **quiet).fit(module_cls())  # fmt: skip
    rec = Record()
    trainer_cls(max_epochs=2, limit_train_batches=2, limit_val_batches=1, callbacks=[rec, ckpt_cls()],
                **quiet).fit(module_cls(), ckpt_path=ckpt.best_model_path)  # fmt: skip
    return rec.seen


def test_sanity_check_of_a_run_resumed_from_an_epoch_end_shows_lightnings_epoch(tmp_path):
    theirs = _epochs_seen(pl.Trainer, pl.demos.boring_classes.BoringModel, pl.Callback,
                          pl.callbacks.ModelCheckpoint, tmp_path / "pl")  # fmt: skip
    from callbacks import ModelCheckpoint

    ours = _epochs_seen(Trainer, BoringModel, Callback, ModelCheckpoint, tmp_path / "tandem")
    assert ours == theirs == [("sanity", 0), ("train", 1)]
