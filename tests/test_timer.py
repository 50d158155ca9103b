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


@pytest.mark.parametrize("bad", [8.64e13, float("nan"), float("inf"), -5, 0, {"hourz": 1}, "1:2"])
def test_unusable_max_time_is_a_config_error(bad):
    with pytest.raises(ConfigError, match="Timer duration"):
        Trainer(max_time=bad, logger=False)
