"""Timer and max_time: stopping after a duration, its saved state, and parsing durations."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from callback_tasks import Scored, fit

from callbacks import Timer
from callbacks.timer import parse_duration
from tandem_core.errors import ConfigError
from trainer import Trainer


class Slow(Scored):
    def training_step(self, batch, batch_idx):
        time.sleep(0.02)
        return super().training_step(batch, batch_idx)


def test_max_time_stops_training_and_timer_state_round_trips():
    trainer = fit(Slow(), [], epochs=1000, val=False, enable_checkpointing=False, max_time={"seconds": 0.3})
    timer = next(cb for cb in trainer.callbacks if isinstance(cb, Timer))
    assert 1 <= trainer.global_step < 30
    assert timer.time_elapsed() >= 0.3
    resumed = Timer(duration=timedelta(seconds=10))
    resumed.load_state_dict(timer.state_dict())
    assert resumed.time_elapsed() == pytest.approx(timer.time_elapsed("train"), abs=1e-6)
    assert resumed.time_remaining() == pytest.approx(10 - timer.time_elapsed("train"), abs=1e-6)


def test_timer_durations():
    assert parse_duration("01:02:03:04") == timedelta(days=1, hours=2, minutes=3, seconds=4)
    assert parse_duration({"minutes": 5}) == timedelta(minutes=5)
    assert parse_duration(1.5) == timedelta(seconds=1.5)
    with pytest.raises(ConfigError, match="DD:HH:MM:SS"):
        parse_duration("2 hours")


@pytest.mark.parametrize("bad", [8.64e13, float("nan"), float("inf"), -5, {"hourz": 1}, "1:2"])
def test_unusable_max_time_is_a_config_error(bad):
    with pytest.raises(ConfigError, match="Timer duration"):
        Trainer(max_time=bad, logger=False)


@pytest.mark.parametrize("kwargs", [{"interval": "step"}, {"interval": "epoch"}, {"min_epochs": 2}])
def test_zero_duration_stops_before_training_as_lightning(kwargs, tmp_path):
    """duration 0 is accepted; the check at on_fit_start stops before the first step (min_epochs still run)."""
    import logging
    import warnings
    from datetime import timedelta

    import pytorch_lightning as pl
    import pytorch_lightning.demos.boring_classes

    from trainer.demos import BoringModel

    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    quiet = dict(
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False
    )
    timer_kw = {k: v for k, v in kwargs.items() if k == "interval"}
    loop_kw = {k: v for k, v in kwargs.items() if k != "interval"}
    ends = []
    for trainer_cls, timer_cls, module in (
        (pl.Trainer, pl.callbacks.Timer, pl.demos.boring_classes.BoringModel()),
        (Trainer, Timer, BoringModel()),
    ):
        trainer = trainer_cls(callbacks=[timer_cls(duration=timedelta(0), verbose=False, **timer_kw)],
                              limit_train_batches=3, limit_val_batches=0, default_root_dir=str(tmp_path), **quiet,
                              **loop_kw)  # fmt: skip
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(module)
        ends.append((trainer.global_step, trainer.current_epoch))
    assert ends[0] == ends[1]
