"""A time-based val_check_interval ("DD:HH:MM:SS", a timedelta, a dict) validates after the same batches as
Lightning 2.6's, on a clock that advances 10 s per training step (time.monotonic patched for both)."""

from __future__ import annotations

import time
import warnings
from datetime import timedelta

import pytest
import torch

from trainer import Task, Trainer

pl = pytest.importorskip("pytorch_lightning")
STEP_S = 10.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def loaders():
    g = torch.Generator().manual_seed(0)
    train = torch.utils.data.TensorDataset(torch.randn(40, 3, generator=g))
    val = torch.utils.data.TensorDataset(torch.randn(8, 3, generator=g))
    return torch.utils.data.DataLoader(train, batch_size=4), torch.utils.data.DataLoader(val, batch_size=4)


def body(base, clock, seen):
    class Body(base):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(3, 1)
            self.steps = 0

        def training_step(self, batch, batch_idx):
            self.steps += 1
            clock.now += STEP_S
            return self.net(batch[0]).pow(2).mean()

        def validation_step(self, batch, batch_idx):
            return None

        def on_validation_start(self):
            if not self.trainer.sanity_checking:
                seen.append((self.current_epoch, self.steps))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    return Body()


def run(make_trainer, base, interval, every, monkeypatch):
    clock, seen = Clock(), []
    monkeypatch.setattr(time, "monotonic", clock)
    train, val = loaders()
    trainer = make_trainer(max_epochs=3, val_check_interval=interval, check_val_every_n_epoch=every, logger=False,
                           enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                           num_sanity_val_steps=0)  # fmt: skip
    trainer.fit(body(base, clock, seen), train, val)
    monkeypatch.undo()
    return seen


@pytest.mark.parametrize(
    "interval,every",
    [("00:00:00:25", 1), ({"seconds": 25}, 2), (timedelta(seconds=45), 1), ("00:00:01:00", 3)],
    ids=["str", "dict-every-2", "timedelta", "every-3"],
)
def test_validation_moments_equal_lightnings(interval, every, monkeypatch):
    def lightning(**kw):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return pl.Trainer(accelerator="cpu", **kw)

    theirs = run(lightning, pl.LightningModule, interval, every, monkeypatch)
    ours = run(lambda **kw: Trainer(accelerator="cpu", **kw), Task, interval, every, monkeypatch)
    assert ours == theirs
    assert theirs  # the interval did trigger validations


def test_time_based_interval_is_checked_when_given():
    from tandem_core.errors import ConfigError

    with pytest.raises(ConfigError, match="val_check_interval must be a usable duration"):
        Trainer(val_check_interval="30 seconds")
