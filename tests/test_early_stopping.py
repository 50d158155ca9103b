"""EarlyStopping: the stopping criteria, a missing key, the decision across ranks, and its saved state."""

from __future__ import annotations

import math

import pytest
import torch
from callback_tasks import QUIET, Scored, fit, loader

from callbacks import EarlyStopping, ModelCheckpoint
from callbacks.early_stopping import EarlyStoppingReason
from strategies.comm import Comm
from strategies.single import SingleDeviceStrategy
from tandem_core.errors import ConfigError
from trainer import Trainer


@pytest.mark.parametrize(
    ("scores", "kwargs", "stopped"),
    [
        ([5, 4, 4.5, 4.2, 3, 2, 1, 0], {"patience": 2}, 3),
        ([5, 4.8, 4.75, 4.4, 4.2, 4, 3.8, 3.6], {"patience": 2, "min_delta": 0.3}, 2),
        ([5, 4, 3, 2, 1, 0, -1, -2], {"stopping_threshold": 3}, 3),
        ([5, 4, 12, 2, 1, 0, -1, -2], {"divergence_threshold": 10}, 2),
        ([5, 4, math.nan, 2, 1, 0, -1, -2], {}, 2),
        ([1, 2, 3, 4, 5, 6, 7, 8], {"mode": "max", "patience": 1}, None),
        ([1, 2, 2, 4, 5, 6, 7, 8], {"mode": "max", "patience": 1}, 2),
    ],
)
def test_early_stopping_criteria(scores, kwargs, stopped):
    es = EarlyStopping("val/score", **kwargs)
    trainer = fit(Scored(scores), [es], epochs=8, enable_checkpointing=False)
    if stopped is None:
        assert trainer.current_epoch == 8 and es.stopping_reason == EarlyStoppingReason.NOT_STOPPED
        assert es.stopping_reason_message is None
    else:
        assert (es.stopped_epoch, trainer.current_epoch) == (stopped, stopped + 1)
        assert es.stopping_reason != EarlyStoppingReason.NOT_STOPPED and es.stopping_reason_message


def test_early_stopping_missing_key_raises_or_warns():
    with pytest.raises(ConfigError, match=r"'val/loss'.*logged keys: \[.*'val/score'"):
        fit(Scored(), [EarlyStopping("val/loss")], epochs=2, enable_checkpointing=False)
    with pytest.warns(UserWarning, match="val/loss"):
        trainer = fit(
            Scored(), [EarlyStopping("val/loss", strict=False)], epochs=2, enable_checkpointing=False
        )
    assert trainer.current_epoch == 2


def test_a_check_before_the_first_validation_waits_for_it():
    """Checked at every epoch end but validated every second epoch: epoch 0 has no value yet."""
    scores = [5.0, 4.0, 3.0, 2.0, 1.0, 0.0]
    es = EarlyStopping("val/score", patience=2, check_on_train_epoch_end=True)
    with pytest.warns(UserWarning, match="Skipping this check until validation has run"):
        trainer = fit(Scored(scores), [es], 6, check_val_every_n_epoch=2, enable_checkpointing=False)
    assert trainer.current_epoch == 6 and es.stopping_reason == EarlyStoppingReason.NOT_STOPPED
    assert es.best_score == scores[-1]  # the last validation's value was seen


class _OtherRankVotesStop(Comm):
    def reduce(self, tensor, op="mean"):
        return torch.ones_like(tensor) if op == "max" else tensor


class OtherRankVotesStop(SingleDeviceStrategy):
    """As if another rank's EarlyStopping wanted to stop: a 'max' reduction of the flag gives 1."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.comm = _OtherRankVotesStop()


def test_early_stopping_decision_is_reduced_across_ranks():
    es = EarlyStopping("val/score", patience=5)
    trainer = Trainer(
        strategy=OtherRankVotesStop(accelerator="cpu"),
        max_epochs=5,
        callbacks=[es],
        **{**QUIET, "enable_checkpointing": False},
    )
    trainer.fit(Scored([5, 4, 3, 2, 1]), loader(), loader(2, 2))
    assert trainer.current_epoch == 1 and es.stopping_reason_message == "another rank asked to stop"


def test_early_stopping_state_goes_into_the_checkpoint(tmp_path):
    es = EarlyStopping("val/score", patience=3)
    cb = ModelCheckpoint(dirpath=str(tmp_path), save_last=True)
    fit(Scored([5, 6, 7, 8]), [cb, es], epochs=3)
    state = torch.load(cb.last_model_path, weights_only=False)["callbacks"][es.state_key]
    assert state == {"wait_count": 2, "stopped_epoch": 0, "best_score": 5.0, "patience": 3, "stopping_reason": 0,
                     "stopping_reason_message": None}  # fmt: skip
    again = EarlyStopping("val/score", patience=3)
    trainer = fit(
        Scored([5, 6, 7, 8, 9, 10]),
        [ModelCheckpoint(dirpath=str(tmp_path)), again],
        epochs=6,
        ckpt_path=cb.last_model_path,
    )
    assert again.stopped_epoch == 3 and trainer.current_epoch == 4  # the third check without improvement


def test_arguments_are_checked_and_readable():
    es = EarlyStopping("val/acc", min_delta=-0.5, mode="max")
    assert (es.monitor, es.mode, es.min_delta, es.best_score) == ("val/acc", "max", 0.5, -math.inf)
    with pytest.raises(ConfigError, match="EarlyStopping mode"):
        EarlyStopping("val/acc", mode="maximum")
    with pytest.raises(ConfigError, match="patience"):
        EarlyStopping("val/acc", patience=-1)
