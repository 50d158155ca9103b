"""W&B and MLflow loggers, the quick part: refusals, rank != 0 does nothing, Lightning's log_model rule
(compared with Lightning's own checkpoint scan). Fits read back through each tracker's own client (offline
W&B runs, MLflow stores and a local mlflow server, resume, ddp x2) are in test_trackers_slow.py."""

from __future__ import annotations

import os
import time

import pytest
import torch

from tandem_core.errors import ConfigError
from tests.helpers.trackers import needs_mlflow, needs_wandb
from trainer.loggers import MLFlowLogger, WandbLogger
from trainer.loggers.dummy import DummyExperiment
from trainer.loggers.trackers import ModelUploads

# wandb and mlflow come with the `trackers` extra, installed by `make test-slow`, which runs these
pytestmark = pytest.mark.trackers


@pytest.mark.parametrize("name", ["CometLogger", "NeptuneLogger", "LitLogger"])
def test_other_lightning_loggers_are_refused_naming_what_works(name):
    import trainer.loggers

    cls = getattr(
        trainer.loggers, name
    )  # importable (scripts that pick a logger at run time import them all)
    with pytest.raises(ConfigError, match=f"{name} is not available.*WandbLogger, MLFlowLogger"):
        cls(save_dir=".")


@needs_wandb
def test_wandb_refuses_what_lightning_refuses(tmp_path):
    with pytest.raises(ConfigError, match="cannot be uploaded in offline mode"):
        WandbLogger(save_dir=str(tmp_path), offline=True, log_model=True)
    with pytest.raises(ConfigError, match="log_model must be True, False or 'all'"):
        WandbLogger(save_dir=str(tmp_path), log_model="best")


@needs_wandb
def test_wandb_arguments_mean_what_they_mean_in_lightning(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_PROJECT", "from-env")
    lg = WandbLogger(name="display", save_dir=str(tmp_path), version="abc", entity="team", tags=["x"])
    assert (lg.name, lg.save_dir, lg.version) == ("from-env", str(tmp_path), "abc")  # no run started
    assert lg.log_dir == os.path.join(str(tmp_path), "from-env", "abc")
    assert lg._init["name"] == "display" and lg._init["resume"] == "allow"
    assert lg._init["entity"] == "team" and lg._init["tags"] == ["x"]  # other keywords go to wandb.init
    assert WandbLogger(id="xyz", project="p", save_dir=None, dir=str(tmp_path)).save_dir == str(tmp_path)


@needs_wandb
@needs_mlflow
def test_ranks_other_than_zero_create_and_write_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    for lg in (WandbLogger(save_dir=str(tmp_path)), MLFlowLogger(save_dir=str(tmp_path / "mlruns"))):
        assert isinstance(lg.experiment, DummyExperiment)
        lg.experiment.log({"a": 1})  # user code on every rank: does nothing
        lg.log_metrics({"a": 1.0}, step=0)
        lg.log_hyperparams({"lr": 0.1})
        lg.finalize("success")
        assert lg.version is None
    assert os.listdir(tmp_path) == []  # no run directory, no tracking store


@needs_wandb
@needs_mlflow
def test_a_config_builds_both_trackers_with_their_arguments(tmp_path):
    from trainer.config.build import build_trainer

    wandb_node = {"_target_": "trainer.loggers.WandbLogger", "project": "p", "save_dir": str(tmp_path)}
    mlflow_node = {"_target_": "trainer.loggers.MLFlowLogger", "experiment_name": "e", "log_model": True}
    wandb_node.update(log_model="all", tags=["a"])
    mlflow_node.update(tracking_uri=f"sqlite:///{tmp_path}/m.db", tags={"k": "v"})
    trainer = build_trainer({"trainer": {"max_epochs": 1}, "logger": [wandb_node, mlflow_node]})
    wl, ml = trainer.loggers
    assert isinstance(wl, WandbLogger) and isinstance(ml, MLFlowLogger)
    assert (wl.name, wl._uploads.log_model, wl._init["tags"]) == ("p", "all", ["a"])
    assert (ml._experiment_name, ml._uploads.log_model, ml.tags, ml.save_dir) == ("e", True, {"k": "v"}, None)
    assert os.listdir(tmp_path) == []  # nothing started before fit


class _Saved:
    """What a ModelCheckpoint exposes to a tracker after saving (the attributes Lightning's scan reads)."""

    def __init__(self, save_top_k: int) -> None:
        self.save_top_k, self.monitor, self.mode = save_top_k, "val/loss", "min"
        self.best_k_models: dict[str, torch.Tensor] = {}
        self.best_model_path, self.best_model_score, self.last_model_path, self.current_score = (
            "",
            None,
            "",
            None,
        )


def _save(tmp_path, cb: _Saved, name: str, score: float, mtime: float) -> None:
    path = str(tmp_path / name)
    with open(path, "wb") as f:
        f.write(name.encode())
    os.utime(path, (mtime, mtime))
    if name.startswith("last"):
        cb.last_model_path, cb.current_score = path, torch.tensor(score)
    else:
        cb.best_k_models[path] = torch.tensor(score)
        cb.best_model_path = min(cb.best_k_models, key=lambda p: float(cb.best_k_models[p]))
        cb.best_model_score = cb.best_k_models[cb.best_model_path]


@pytest.mark.parametrize("log_model", [True, "all", False])
@pytest.mark.parametrize("save_top_k", [1, -1])
def test_log_model_uploads_what_lightning_uploads(tmp_path, log_model, save_top_k):
    """The same saves through our rule and Lightning's (_scan_checkpoints + after_save_checkpoint's test)."""
    from pytorch_lightning.loggers.utilities import _scan_checkpoints

    ours, theirs, uploads, lightning_logged = [], [], ModelUploads(log_model), {}
    cb, now = _Saved(save_top_k), time.time() - 100
    held: _Saved | None = None
    saves = [("epoch=0.ckpt", 0.9), ("last.ckpt", 0.9), ("epoch=1.ckpt", 0.5), ("last.ckpt", 0.5)]
    for i, (name, score) in enumerate(saves):
        _save(tmp_path, cb, name, score, now + i)
        uploads.after_save(cb, lambda p, aliases, meta: ours.append((os.path.basename(p), aliases)))
        if log_model == "all" or (
            log_model is True and save_top_k == -1
        ):  # Lightning's after_save_checkpoint
            for t, p, _, _ in _scan_checkpoints(cb, lightning_logged):
                theirs.append(
                    (os.path.basename(p), ["latest", "best"] if p == cb.best_model_path else ["latest"])
                )
                lightning_logged[p] = t
        elif log_model is True:
            held = cb
    uploads.at_end(lambda p, aliases, meta: ours.append((os.path.basename(p), aliases)))
    if held is not None:  # Lightning's finalize
        for _t, p, _, _ in _scan_checkpoints(held, lightning_logged):
            theirs.append(
                (os.path.basename(p), ["latest", "best"] if p == held.best_model_path else ["latest"])
            )
    assert ours == theirs
    assert bool(ours) == bool(log_model)
