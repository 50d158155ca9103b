"""SpikeDetection: a loss far above the recent mean stops training, naming the batch, and the batches are
written to the exclude list; its window survives a checkpoint."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import FAST
from torch.utils.data import DataLoader, TensorDataset

from callbacks import SpikeDetection
from callbacks.spike import TrainingSpikeException
from trainer import Task, Trainer


class Spiky(Task):
    """Loss 1.0 for every batch but batch `at`, where it is `value`."""

    def __init__(self, at: int, value: float) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.at, self.value = at, value

    def training_step(self, batch, batch_idx):
        base = self.value if batch_idx == self.at else 1.0
        return self.w.sum() * 0 + base

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def data() -> DataLoader:
    return DataLoader(TensorDataset(torch.zeros(12, 1)), batch_size=1)


def test_a_spike_stops_training_and_names_the_batches(tmp_path):
    cb = SpikeDetection(exclude_batches_path=str(tmp_path))
    with pytest.raises(TrainingSpikeException, match="batch 7"):
        Trainer(max_epochs=1, callbacks=[cb], default_root_dir=str(tmp_path), **FAST).fit(
            Spiky(7, 5.0), data()
        )
    assert json.loads((tmp_path / "skip_batches.json").read_text()) == [6, 7]


def test_small_changes_and_improvements_are_not_spikes(tmp_path):
    cb = SpikeDetection(exclude_batches_path=str(tmp_path / "x.json"))
    Trainer(max_epochs=1, callbacks=[cb], **FAST).fit(Spiky(7, 2.5), data())  # 2.5 - 1 < 2 * 1: no spike
    Trainer(max_epochs=1, callbacks=[cb], **FAST).fit(Spiky(7, 0.1), data())  # better: no spike
    with pytest.raises(TrainingSpikeException):
        Trainer(max_epochs=1, callbacks=[SpikeDetection(exclude_batches_path=str(tmp_path))], **FAST).fit(
            Spiky(3, float("nan")), data()
        )  # not finite


def test_state_round_trip():
    cb = SpikeDetection(window=3)
    cb.values.extend([1.0, 2.0, 3.0, 4.0])
    cb.last_val = 4.0
    other = SpikeDetection(window=3)
    other.load_state_dict(cb.state_dict())
    assert list(other.values) == [2.0, 3.0, 4.0] and other._running_mean() == 3.0 and other.last_val == 4.0
