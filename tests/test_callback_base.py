"""callbacks/base.py: Lightning's Checkpoint base, and two stateful callbacks with one state key refused (their
states would merge in a checkpoint: after a resume one ModelCheckpoint would hold the other's best path)."""

from __future__ import annotations

import pytest
from callback_tasks import Scored, loader

from callbacks import (
    Callback,
    Checkpoint,
    EarlyStopping,
    LambdaCallback,
    ModelCheckpoint,
    OnExceptionCheckpoint,
    StochasticWeightAveraging,
)
from tandem_core.errors import ConfigError
from trainer import Trainer


def test_two_callbacks_with_one_state_key_are_refused_naming_both():
    with pytest.raises(ConfigError, match=r"ModelCheckpoint.*ModelCheckpoint"):
        Trainer(callbacks=[ModelCheckpoint(monitor="a"), ModelCheckpoint(monitor="a")])
    with pytest.raises(ConfigError, match="same key"):
        Trainer(callbacks=[StochasticWeightAveraging(0.1), StochasticWeightAveraging(0.2)])
    # different arguments, different keys; callbacks without state may repeat
    Trainer(
        callbacks=[
            ModelCheckpoint(monitor="a"),
            ModelCheckpoint(monitor="b"),
            EarlyStopping("a"),
            EarlyStopping("b"),
        ]
    )
    Trainer(callbacks=[LambdaCallback(), LambdaCallback()])


class Twice(Scored):
    def configure_callbacks(self):
        return [EarlyStopping("val/score"), EarlyStopping("val/score")]


def test_configure_callbacks_is_checked_too(tmp_path):
    with pytest.raises(ConfigError, match="same key"):
        Trainer(max_epochs=1, default_root_dir=str(tmp_path), logger=False).fit(
            Twice(), loader(), loader(2, 2)
        )


def test_checkpoint_callbacks_are_checkpoints(tmp_path):
    assert issubclass(ModelCheckpoint, Checkpoint) and issubclass(OnExceptionCheckpoint, Checkpoint)
    assert issubclass(Checkpoint, Callback)
