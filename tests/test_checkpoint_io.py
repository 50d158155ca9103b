"""Checkpoint files: checked reads (user mistakes name what to change) and atomic writes."""

from __future__ import annotations

import os

import pytest
import torch
from conftest import FAST
from helpers.checkpointing import Net, run_fit
from torch import nn

from strategies.checkpoint import io as ckpt_io
from tandem_core.errors import CheckpointError, TandemError
from trainer import Trainer

# ----- user mistakes -----------------------------------------------------------------------------


def test_missing_ckpt_path_raises(tmp_path):
    missing = str(tmp_path / "nope.ckpt")
    with pytest.raises(CheckpointError, match="does not exist"):
        run_fit(tmp_path, ckpt_path=missing, max_steps=1)


def test_checkpoint_from_a_different_model_names_the_keys(tmp_path):
    _, trainer, _ = run_fit(tmp_path, max_steps=1, task_kw={"hidden": 8})
    path = str(tmp_path / "h8.ckpt")
    trainer.save_checkpoint(path)
    with pytest.raises(CheckpointError, match=r"net\.0\.weight") as info:
        run_fit(tmp_path, ckpt_path=path, max_steps=2, task_kw={"hidden": 6})
    assert "(6, 4)" in str(info.value) and "(8, 4)" in str(info.value)
    assert isinstance(info.value, TandemError)

    class Other(Net):
        def __init__(self, **kw) -> None:
            super().__init__(**kw)
            self.extra = nn.Linear(2, 2)

    with pytest.raises(CheckpointError, match=r"missing keys \['extra\.weight', 'extra\.bias'\]"):
        run_fit(tmp_path, ckpt_path=path, max_steps=2, task_cls=Other)


def test_not_a_checkpoint_raises(tmp_path):
    path = tmp_path / "junk.ckpt"
    path.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="is not in torch's zip format"):
        ckpt_io.load(path)
    torch.save({"weights": 1}, path)
    with pytest.raises(CheckpointError, match="has no 'tandem_version'.* not written by this Tandem"):
        ckpt_io.load(path)


def test_save_checkpoint_before_fit_raises(tmp_path):
    with pytest.raises(CheckpointError, match="during or after fit"):
        Trainer(default_root_dir=str(tmp_path), **FAST).save_checkpoint(str(tmp_path / "x.ckpt"))


# ----- atomic write ------------------------------------------------------------------------------


def test_atomic_save_writes_and_leaves_no_temp_file(tmp_path):
    path = tmp_path / "sub" / "a.ckpt"
    ckpt_io.atomic_save({"state_dict": {"w": torch.ones(2)}}, path)
    assert torch.equal(torch.load(path)["state_dict"]["w"], torch.ones(2))
    ckpt_io.atomic_save({"state_dict": {"w": torch.zeros(2)}}, path)
    assert torch.equal(torch.load(path)["state_dict"]["w"], torch.zeros(2))
    assert os.listdir(tmp_path / "sub") == ["a.ckpt"]


@pytest.mark.parametrize("exc", [RuntimeError("disk full"), KeyboardInterrupt()])
def test_atomic_save_failure_keeps_previous_file(tmp_path, monkeypatch, exc):
    path = tmp_path / "a.ckpt"
    ckpt_io.atomic_save({"state_dict": {"w": torch.ones(3)}}, path)
    before = path.read_bytes()

    def broken_save(obj, f, *a, **k):
        f.write(b"partial")
        raise exc

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(type(exc)):
        ckpt_io.atomic_save({"state_dict": {"w": torch.zeros(3)}}, path)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["a.ckpt"]


def test_trainer_save_checkpoint_is_atomic(tmp_path, monkeypatch):
    _, trainer, _ = run_fit(tmp_path, max_steps=2)
    path = tmp_path / "t.ckpt"
    trainer.save_checkpoint(str(path))
    before = path.read_bytes()

    def broken_save(obj, f, *a, **k):
        raise OSError("no space left")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError):
        trainer.save_checkpoint(str(path))
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["t.ckpt"]
