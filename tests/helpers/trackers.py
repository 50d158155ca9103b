"""Shared by the W&B and MLflow logger tests: a small task, the offline W&B environment, and readers that
go through each tracker's own client (``wandb leet inspect --json`` on run-*.wandb, ``MlflowClient``)."""

from __future__ import annotations

import csv
import glob
import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from trainer import Task

needs_wandb = pytest.mark.skipif(
    importlib.util.find_spec("wandb") is None,
    reason="wandb is not installed: pip install 'tandem-trainer[wandb]' (make test-slow installs it)",
)
needs_mlflow = pytest.mark.skipif(
    importlib.util.find_spec("mlflow") is None,
    reason="mlflow is not installed: pip install 'tandem-trainer[mlflow]' (make test-slow installs it)",
)
QUIET = dict(enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=1)


def wandb_env(root: str) -> dict[str, str]:
    """W&B offline with every directory it writes (runs, cache, staged artifacts, settings) under `root`."""
    return {
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "WANDB_DIR": root,
        "WANDB_CACHE_DIR": os.path.join(root, "cache"),
        "WANDB_CONFIG_DIR": os.path.join(root, "config"),
        "WANDB_DATA_DIR": os.path.join(root, "data"),
        "WANDB_ARTIFACT_DIR": os.path.join(root, "artifacts"),
        "WANDB_DISABLE_GIT": "true",
        "WANDB_X_DISABLE_STATS": "true",
    }


def data(n: int, seed: int = 0) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(n, 4, generator=g), torch.randint(0, 2, (n,), generator=g))


def loaders() -> tuple[DataLoader, DataLoader]:
    """10 training samples in batches of 4 (3 steps an epoch), 6 validation samples."""
    return DataLoader(data(10), batch_size=4), DataLoader(data(6, seed=1), batch_size=3)


class Small(Task):
    """Logs train/loss every step, val/loss every epoch, and `rank` (its global rank) every step."""

    def __init__(self, lr: float = 0.1, hidden: int = 8) -> None:
        super().__init__()
        self.save_hyperparameters()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(4, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 2)
        )

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("train/loss", loss)
        self.log("rank", float(self.global_rank))
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val/loss", F.cross_entropy(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


def read_csv(path: str) -> dict[str, list[tuple[int, float]]]:
    """The CSVLogger's metrics.csv (the reference every tracker is compared with): key -> [(step, value)]."""
    out: dict[str, list[tuple[int, float]]] = {}
    with open(path) as f:
        for row in csv.DictReader(f):
            for k, v in row.items():
                if k != "step" and v != "":
                    out.setdefault(k, []).append((int(row["step"]), float(v)))
    return out


def wandb_files(save_dir: str, run_id: str) -> list[str]:
    """The run's transaction logs, oldest first (a resumed run writes one more)."""
    return sorted(glob.glob(os.path.join(save_dir, "wandb", f"*run-*-{run_id}", f"run-{run_id}.wandb")))


def wandb_records(path: str) -> list[dict]:
    """Every record of a run-*.wandb file, read by wandb's own reader (``wandb leet inspect --json``)."""
    out = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", "--json", path],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def wandb_history(records: list[dict]) -> dict[str, list[tuple[int, float]]]:
    """key -> [(trainer/global_step, value)] from the history records."""
    out: dict[str, list[tuple[int, float]]] = {}
    for r in records:
        if r["type"] == "history":
            item = r["history"]["item"]
            for k, v in item.items():
                if not k.startswith("_") and k != "trainer/global_step":
                    out.setdefault(k, []).append((int(item["trainer/global_step"]), float(v)))
    return out


def wandb_config(records: list[dict]) -> dict:
    config: dict = {}
    for r in records:
        if r["type"] in ("run", "config"):  # the config at wandb.init, then config.update() calls
            update = (r["run"].get("config", {}) if r["type"] == "run" else r["config"]).get("update", {})
            config.update({k: v for k, v in update.items() if k != "_wandb"})
    return config


def mlflow_history(client, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))
