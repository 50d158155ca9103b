"""Trainer.fit/validate/test/predict take Lightning 2.6's `weights_only`: by default (None, True) a checkpoint
is read as plain data, so one that pickles an object is refused; weights_only=False reads a trusted one
whole, as Lightning (and torch.load) do."""

from __future__ import annotations

import inspect

import pytest
import torch
from conftest import QUIET
from torch.utils.data import DataLoader, TensorDataset

from tandem_core.errors import CheckpointError
from trainer import Task, Trainer


class Extra:
    """A class that a plain-data checkpoint cannot hold."""

    def __init__(self, n: int) -> None:
        self.n = n


class Saves(Task):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(2, 1)
        self.loaded = None

    def training_step(self, batch, batch_idx):
        return self.net(batch[0]).pow(2).mean()

    def validation_step(self, batch, batch_idx):
        self.log("v", self.net(batch[0]).mean())

    def test_step(self, batch, batch_idx):
        self.log("t", self.net(batch[0]).mean())

    def predict_step(self, batch, batch_idx):
        return self.net(batch[0])

    def on_save_checkpoint(self, checkpoint):
        checkpoint["extra"] = Extra(3)

    def on_load_checkpoint(self, checkpoint):
        self.loaded = checkpoint["extra"].n

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _data() -> DataLoader:
    return DataLoader(
        TensorDataset(torch.randn(8, 2, generator=torch.Generator().manual_seed(0))), batch_size=4
    )


@pytest.mark.parametrize("method", ["fit", "validate", "test", "predict"])
def test_the_stage_methods_take_lightnings_arguments_in_its_order(method):
    pl = pytest.importorskip("pytorch_lightning")
    theirs = [
        p for p in inspect.signature(getattr(pl.Trainer, method)).parameters if p not in ("self", "model")
    ]
    ours = [
        p
        for p in inspect.signature(getattr(Trainer, method)).parameters
        if p not in ("self", "task", "model")
    ]
    assert ours == theirs


def test_a_checkpoint_that_pickles_an_object_needs_weights_only_false_for_every_stage(tmp_path):
    trainer = Trainer(max_epochs=1, default_root_dir=str(tmp_path), **QUIET)
    trainer.fit(Saves(), _data())
    path = str(tmp_path / "saved.ckpt")
    trainer.save_checkpoint(path)
    for stage in ("fit", "validate", "test", "predict"):
        run = getattr(Trainer(max_epochs=2, default_root_dir=str(tmp_path), **QUIET), stage)
        with pytest.raises(CheckpointError):
            run(Saves(), _data(), ckpt_path=path)
        task = Saves()
        run = getattr(Trainer(max_epochs=2, default_root_dir=str(tmp_path), **QUIET), stage)
        run(task, _data(), ckpt_path=path, weights_only=False)
        assert task.loaded == 3, stage
