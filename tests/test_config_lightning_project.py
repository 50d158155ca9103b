"""A LightningCLI config from a real public project runs unchanged through `tandem fit`:
example_config.yaml of github.com/Cogniveon/pytorch-template at commit 07da6ca94fab3a64bc77009786b2a9f990a2e164,
kept byte for byte in tests/lightning_cli_project/ next to minimal re-creations of its model and data module."""

from __future__ import annotations

import os
import shutil
import sys
from typing import Any

import torch

from trainer import config as C
from trainer.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


PROJECT = os.path.join(ROOT, "tests", "lightning_cli_project")
PROJECT_ARGS = [  # the project's train.py gives these as LightningCLI(trainer_defaults=...); max_epochs 10 -> 2
    "--trainer.max_epochs=2",
    "--trainer.log_every_n_steps=5",
    "--trainer.enable_model_summary=false",
    "--trainer.enable_progress_bar",
    "false",
    "--trainer.accelerator=cpu",
]


def run_project(tmp_path: Any, monkeypatch: Any, config: str) -> Any:
    """`tandem fit --config example_config.yaml` in a copy of the project (its model and data modules are
    imported from the working directory, as LightningCLI's script would import them)."""
    work = tmp_path / "project"
    shutil.copytree(PROJECT, work)
    monkeypatch.chdir(work)
    monkeypatch.setattr(sys, "path", list(sys.path))
    for name in [m for m in sys.modules if m.split(".")[0] in ("models", "data_modules")]:
        monkeypatch.delitem(sys.modules, name)
    assert main(["fit", "--config", config, *PROJECT_ARGS]) == 0
    return work / "runs" / "version_0"


def check_project_run(version: Any) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(version))
    events.Reload()
    assert {"train/loss", "val/loss", "val/acc", "lr-Adam"} <= set(events.Tags()["scalars"])  # LR monitor too
    # logging_interval: step, every log_every_n_steps=5 steps: step 4 is in epoch 1, after one StepLR step
    assert [(e.step, round(e.value, 9)) for e in events.Scalars("lr-Adam")] == [(4, 0.0001)]
    best = torch.load(version / "checkpoints" / "best.ckpt", weights_only=False)  # filename: best
    last = torch.load(version / "checkpoints" / "last.ckpt", weights_only=False)  # save_last: true
    assert best["hyper_parameters"] == {"num_classes": 102, "learning_rate": 0.001}
    assert last["global_step"] == best["global_step"]  # last.ckpt is written with each top-k save
    # validation after each of the 2 epochs of limit_train_batches 0.25 x 12 batches: at steps 2 and 5
    assert [e.step for e in events.Scalars("val/loss")] == [2, 5]
    saved = C.resolve(str(version / "config.yaml"))
    assert saved["seed_everything"] == 6839323
    assert [c["_target_"] for c in saved["callbacks"]] == [
        "callbacks.LearningRateMonitor",
        "callbacks.EarlyStopping",
        "callbacks.ModelSummary",
        "callbacks.ModelCheckpoint",
    ]


def test_a_real_projects_lightning_cli_config_runs_unchanged(tmp_path, monkeypatch):
    """example_config.yaml of github.com/Cogniveon/pytorch-template, commit
    07da6ca94fab3a64bc77009786b2a9f990a2e164 (tests/lightning_cli_project/example_config.yaml, byte for byte),
    run by `tandem fit` with the trainer_defaults of the project's train.py as --trainer.x=v options. The
    project's SwinTransformer and Flowers102DataModule are re-created minimally on Tandem's classes (the
    originals download pretrained weights and a data set); Lightning's callback and logger paths name Tandem's."""
    check_project_run(run_project(tmp_path, monkeypatch, "example_config.yaml"))
