"""OnExceptionCheckpoint and ModelCheckpoint(save_on_exception=True): a crash leaves a checkpoint that loads and
resumes; a later successful run that resumed from it removes it, and never another run's file."""

from __future__ import annotations

import os

import pytest
import torch
from callback_tasks import Scored, loader
from conftest import FAST

from callbacks import Callback, ModelCheckpoint, OnExceptionCheckpoint
from trainer import Trainer


class CrashAt(Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, task, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            raise RuntimeError("crash")


def test_a_crash_writes_a_loadable_checkpoint_and_the_resumed_run_removes_it(tmp_path):
    cb = OnExceptionCheckpoint(str(tmp_path))
    with pytest.raises(RuntimeError, match="crash"):
        Trainer(max_epochs=3, callbacks=[cb, CrashAt(3)], **FAST).fit(Scored(), loader())
    path = tmp_path / "on_exception.ckpt"
    saved = torch.load(path, weights_only=True)
    assert saved["global_step"] == 3
    task = Scored.load_from_checkpoint(str(path))
    assert torch.equal(task.net.weight, saved["state_dict"]["net.weight"])
    other = tmp_path / "other"
    other.mkdir()
    (other / "on_exception.ckpt").write_bytes(path.read_bytes())  # another run's file in another place
    trainer = Trainer(max_epochs=3, callbacks=[OnExceptionCheckpoint(str(tmp_path))], **FAST)
    trainer.fit(Scored(), loader(), ckpt_path=str(path))
    assert trainer.global_step == 6 and not path.exists() and (other / "on_exception.ckpt").exists()
    Trainer(max_epochs=1, callbacks=[OnExceptionCheckpoint(str(other))], **FAST).fit(Scored(), loader())
    assert (other / "on_exception.ckpt").exists()  # not resumed from it: kept


def test_model_checkpoint_save_on_exception(tmp_path):
    cb = ModelCheckpoint(dirpath=str(tmp_path), save_on_exception=True, every_n_epochs=10)
    with pytest.raises(RuntimeError):
        Trainer(max_epochs=3, callbacks=[cb, CrashAt(3)], **{**FAST, "enable_checkpointing": True}).fit(
            Scored(), loader()
        )
    assert os.listdir(tmp_path) == ["epoch=1-step=3.ckpt"]
