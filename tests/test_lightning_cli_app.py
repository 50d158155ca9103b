"""A Lightning project whose entry point is `LightningCLI(Model, DataModule)` (tests/lightning_cli_app/, written
in Lightning's form) runs `python main.py fit --config config.yaml` under Lightning and, with only its import
lines rewritten, under Tandem: the same metrics (CSVLogger's metrics.csv, row for row), the same checkpoints
(names, steps, weights, the best score), the same hyperparameters and the same model and data config."""

from __future__ import annotations

import csv
import math
import os
import shutil
import subprocess
import sys
from typing import Any

import torch
import yaml

from trainer.checkpoint import load

HERE = os.path.dirname(os.path.abspath(__file__))
APP = os.path.join(HERE, "lightning_cli_app")
ROOT = os.path.dirname(HERE)
# the whole port: Lightning's import lines and Tandem's (each file's other lines stay as they are)
PORT = {
    "from pytorch_lightning.cli import LightningCLI": "from trainer.cli import LightningCLI",
    "from pytorch_lightning import LightningModule": "from trainer import Task as LightningModule",
    "from pytorch_lightning import LightningDataModule": "from trainer import DataModule as LightningDataModule",
}


def port(directory: Any) -> list[str]:
    """Rewrite the project's import lines to Tandem's; returns the lines changed (nothing else changes)."""
    changed = []
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".py"):
            continue
        path = os.path.join(directory, name)
        lines = open(path).read().split("\n")
        new = [PORT.get(line, line) for line in lines]
        changed += [f"{name}: {a} -> {b}" for a, b in zip(lines, new) if a != b]
        open(path, "w").write("\n".join(new))
    return changed


def _start(directory: Any, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": ROOT, "PYTHONWARNINGS": "ignore"}
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TANDEM_GLOBAL_SEED"):
        env.pop(var, None)
    cmd = [sys.executable, "main.py", *args]
    return subprocess.Popen(
        cmd, cwd=directory, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _metrics(version: Any) -> list[dict[str, float]]:
    with open(version / "metrics.csv") as f:
        return [{k: float(v) for k, v in row.items() if v != ""} for row in csv.DictReader(f)]


def _close(a: list[dict[str, float]], b: list[dict[str, float]]) -> bool:
    return len(a) == len(b) and all(
        x.keys() == y.keys() and all(math.isclose(x[k], y[k], rel_tol=1e-5, abs_tol=1e-7) for k in x)
        for x, y in zip(a, b)
    )


def test_a_lightning_cli_project_ported_by_its_imports_runs_as_under_lightning(tmp_path):
    lightning, tandem = tmp_path / "lightning", tmp_path / "tandem"
    shutil.copytree(APP, lightning, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(APP, tandem, ignore=shutil.ignore_patterns("__pycache__"))
    assert len(port(tandem)) == 3  # main.py's, model.py's and data.py's framework import, nothing else
    runs = [_start(d, "fit", "--config", "config.yaml") for d in (lightning, tandem)]
    outputs = [p.communicate(timeout=300)[0] for p in runs]
    for p, out in zip(runs, outputs):
        assert p.returncode == 0, out[-3000:]
    ran = {
        name: d / "logs" / "waves" / "version_0" for name, d in (("lightning", lightning), ("tandem", tandem))
    }

    # the metrics, logged at the same steps with the same values (train/val/lr monitor, step and epoch)
    metrics = {name: _metrics(v) for name, v in ran.items()}
    assert len(metrics["lightning"]) > 20 and _close(metrics["lightning"], metrics["tandem"])

    # the checkpoints: the same files (top 2 by val/loss, last), steps, scores and weights
    files = {name: sorted(os.listdir(v / "checkpoints")) for name, v in ran.items()}
    assert (
        files["lightning"] == files["tandem"] and "last.ckpt" in files["tandem"] and len(files["tandem"]) == 3
    )
    for name in files["tandem"]:
        theirs = torch.load(
            ran["lightning"] / "checkpoints" / name, weights_only=False
        )  # Lightning's own file
        ours = load(str(ran["tandem"] / "checkpoints" / name))
        assert (ours["global_step"], ours["epoch"]) == (theirs["global_step"], theirs["epoch"])
        assert ours["state_dict"].keys() == theirs["state_dict"].keys()
        for k, v in theirs["state_dict"].items():
            torch.testing.assert_close(ours["state_dict"][k], v, rtol=1e-5, atol=1e-6)
        # LightningCLI records the parsed config with the instantiator that rebuilds it: each its own
        assert theirs["hyper_parameters"].pop("_instantiator") == "pytorch_lightning.cli.instantiate_module"
        assert ours["hyper_parameters"].pop("_instantiator") == "trainer.cli.instantiate_module"
        assert (
            ours["hyper_parameters"]
            == theirs["hyper_parameters"]
            == {
                "hidden": 24,
                "lr": 0.05,
                "gamma": 0.7,
                "dropout": 0.1,
            }
        )
        key = next(k for k in theirs["callbacks"] if k.startswith("ModelCheckpoint"))
        assert math.isclose(
            ours["callbacks"][key]["best_model_score"], theirs["callbacks"][key]["best_model_score"]
        )

    # what each wrote next to its logs: hparams.yaml, and config.yaml with the same model, data and seed
    hparams = {name: yaml.safe_load((v / "hparams.yaml").read_text()) for name, v in ran.items()}
    assert hparams["lightning"].pop("_instantiator") != hparams["tandem"].pop("_instantiator")
    assert hparams["lightning"] == hparams["tandem"]
    configs = {name: yaml.safe_load((v / "config.yaml").read_text()) for name, v in ran.items()}
    for section in ("seed_everything", "model", "data", "ckpt_path"):
        assert configs["lightning"][section] == configs["tandem"][section], section
    # Lightning's class paths in the config named Tandem's classes of the same name
    assert [c["class_path"] for c in configs["tandem"]["trainer"]["callbacks"]] == [
        "callbacks.ModelCheckpoint",
        "callbacks.LearningRateMonitor",
        "callbacks.EarlyStopping",
    ]
