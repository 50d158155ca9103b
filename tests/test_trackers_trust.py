"""Issue 34 with the real trackers: fine-tuning from a plain-data checkpoint whose ModelCheckpoint state names
an outside file (a stand-in for ~/.netrc) as its better best_model_path uploads nothing but this run's own
checkpoints: MLFlowLogger(log_model=True) copies no such file into the run's artifacts and WandbLogger
(log_model=True, offline) stages none. Needs the `trackers` extra (make test-slow installs and runs it); the
rule itself (trainer/loggers/trackers.py, shared by both) is tested without them in
tests/test_trust_checkpoint_round3.py."""

from __future__ import annotations

import os

import pytest
import torch

from callbacks import ModelCheckpoint
from tests.helpers.trackers import QUIET, Small, loaders, needs_mlflow, needs_wandb, wandb_env
from trainer import Trainer
from trainer.loggers import MLFlowLogger, WandbLogger

pytestmark = pytest.mark.trackers
MARK = b"machine example.org login me password round3-netrc-marker"


def _crafted(tmp_path) -> tuple[str, str]:
    """(run A's checkpoint with its best_model_path pointed outside and a better score, the outside file)."""
    outside = tmp_path / "home" / ".netrc"
    outside.parent.mkdir()
    outside.write_bytes(MARK)
    mc = ModelCheckpoint(dirpath=str(tmp_path / "run_a"), monitor="val/loss", save_last=True)
    Trainer(max_epochs=1, logger=False, callbacks=[mc], default_root_dir=str(tmp_path / "a"), **QUIET).fit(
        Small(lr=0.05), *loaders()
    )
    ckpt = torch.load(tmp_path / "run_a" / "last.ckpt", weights_only=True)
    for key, state in ckpt["callbacks"].items():
        if key.startswith("ModelCheckpoint"):
            state.update(best_model_path=str(outside), best_model_score=-1.0)
    torch.save(ckpt, tmp_path / "crafted.ckpt")
    return str(tmp_path / "crafted.ckpt"), str(outside)


def _holding_mark(root, outside: str) -> list[str]:
    found = []
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            if os.path.realpath(path) != os.path.realpath(outside) and not os.path.islink(path):
                with open(path, "rb") as f:
                    if MARK in f.read():
                        found.append(path)
    return found


def _fine_tune(tmp_path, logger, crafted: str) -> ModelCheckpoint:
    mc = ModelCheckpoint(monitor="val/loss", save_last=True)
    with pytest.warns(UserWarning, match="not this run's file"):
        Trainer(
            max_epochs=3, logger=[logger], callbacks=[mc], default_root_dir=str(tmp_path / "b"), **QUIET
        ).fit(Small(lr=0.05), *loaders(), ckpt_path=crafted)
    return mc


@needs_mlflow
def test_mlflow_log_model_uploads_no_file_a_checkpoint_names(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    crafted, outside = _crafted(tmp_path)
    store = str(tmp_path / "mlruns")
    mc = _fine_tune(tmp_path, MLFlowLogger("trust", save_dir=store, log_model=True), crafted)
    assert os.path.dirname(mc.best_model_path) == mc.dirpath
    assert _holding_mark(store, outside) == []
    uploaded = {n for _, dirs, _ in os.walk(store) for n in dirs}
    assert os.path.splitext(os.path.basename(mc.best_model_path))[0] in uploaded  # its own best went up
    assert ".netrc" not in uploaded


@needs_wandb
def test_wandb_log_model_stages_no_file_a_checkpoint_names(tmp_path, monkeypatch):
    import wandb

    root = tmp_path / "wandb"
    for k, v in wandb_env(str(root)).items():
        monkeypatch.setenv(k, v)
    crafted, outside = _crafted(tmp_path)
    try:
        mc = _fine_tune(tmp_path, WandbLogger(project="trust", save_dir=str(root), log_model=True), crafted)
    finally:
        wandb.finish()
        wandb.teardown()
        monkeypatch.delenv("WANDB_SERVICE", raising=False)
    assert os.path.dirname(mc.best_model_path) == mc.dirpath
    assert _holding_mark(root, outside) == []
