"""The callbacks a Trainer adds by itself, their order, and that only rank 0 writes or prints."""

from __future__ import annotations

import os

import pytest
from callback_tasks import Scored, loader

from callbacks import EarlyStopping, LearningRateMonitor, ModelCheckpoint, ModelSummary, TQDMProgressBar
from strategies.comm import Comm
from strategies.single import SingleDeviceStrategy
from tandem_core.errors import ConfigError
from trainer import Trainer
from trainer.loggers import CSVLogger


def test_defaults_follow_the_enable_flags_and_put_checkpointing_last():
    es = EarlyStopping("val/score")
    kinds = [type(cb) for cb in Trainer(callbacks=[ModelCheckpoint(), es]).callbacks]
    assert kinds == [EarlyStopping, TQDMProgressBar, ModelSummary, ModelCheckpoint]
    assert (
        Trainer(enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False).callbacks
        == []
    )
    with pytest.raises(ConfigError, match="enable_checkpointing=False"):
        Trainer(enable_checkpointing=False, callbacks=[ModelCheckpoint()])
    with pytest.raises(ConfigError, match="enable_progress_bar=False"):
        Trainer(enable_progress_bar=False, callbacks=TQDMProgressBar())
    with pytest.raises(ConfigError, match="mutually exclusive"):
        ModelCheckpoint(every_n_epochs=2, every_n_train_steps=5)
    with pytest.raises(ConfigError, match="needs monitor"):
        ModelCheckpoint(save_top_k=3)


class _RankOne(Comm):
    @property
    def rank(self) -> int:
        return 1


class RankOne(SingleDeviceStrategy):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.comm = _RankOne()


def test_other_ranks_write_no_files_and_print_nothing(tmp_path, capsys):
    es = EarlyStopping("val/score")
    callbacks = [ModelCheckpoint(monitor="val/score", save_last=True), es, LearningRateMonitor()]
    trainer = Trainer(
        strategy=RankOne(accelerator="cpu"),
        max_epochs=2,
        default_root_dir=str(tmp_path),
        callbacks=callbacks,
        logger=[CSVLogger(str(tmp_path))],
    )
    trainer.fit(Scored(), loader(), loader(2, 2))
    assert os.listdir(tmp_path) == []
    assert capsys.readouterr().out == ""
