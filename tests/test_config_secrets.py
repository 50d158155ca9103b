"""Issue 24: a secret given as ${oc.env:API_KEY} reaches the run but no file the run writes: config.yaml,
the checkpoints (hyperparameters and saved config), the loggers' files and --print-config keep the
interpolation text instead (trainer/secrets.py)."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from tandem_core.errors import CheckpointError
from trainer import DataModule, Task
from trainer import config as C
from trainer.cli import main

HERE = __name__
SECRET = "sk-live-0123456789abcdef"
SEEN: list[str] = []


class SecretTask(Task):
    def __init__(self, token: str, endpoint: str, width: int = 3) -> None:
        super().__init__()
        self.save_hyperparameters()
        SEEN.append(token)
        self.net = torch.nn.Linear(width, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = torch.nn.functional.mse_loss(self.net(batch[0]), batch[1])
        self.log("loss", loss)
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Data(DataModule):
    def train_dataloader(self) -> DataLoader:
        g = torch.Generator().manual_seed(0)
        return DataLoader(TensorDataset(torch.randn(8, 3, generator=g), torch.randn(8, 1, generator=g)), 4)


def _config(tmp_path) -> str:
    path = tmp_path / "run.yaml"
    path.write_text(
        f"""
task:
  _target_: {HERE}.SecretTask
  token: ${{oc.env:API_KEY}}
  endpoint: https://bot:${{oc.env:API_KEY}}@example.org/v1
data: {{_target_: {HERE}.Data}}
trainer:
  default_root_dir: {tmp_path}/runs
  accelerator: cpu
  max_steps: 3
  log_every_n_steps: 1
  enable_progress_bar: false
  enable_model_summary: false
logger:
  - {{_target_: trainer.loggers.CSVLogger, save_dir: "{tmp_path}/runs", name: csv}}
  - {{_target_: trainer.loggers.TensorBoardLogger, save_dir: "{tmp_path}/runs", name: tb}}
callbacks:
  - {{_target_: callbacks.ModelCheckpoint, save_last: true, every_n_train_steps: 1, save_top_k: -1}}
"""
    )
    return str(path)


def _files_holding(root, text: str) -> list[str]:
    found = []
    for folder, _, names in os.walk(root):
        for name in names:
            with open(os.path.join(folder, name), "rb") as f:
                if text.encode() in f.read():
                    found.append(os.path.join(folder, name))
    return found


def test_an_environment_secret_is_in_no_written_file(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("API_KEY", SECRET)
    cfg = _config(tmp_path)
    SEEN.clear()
    assert main(["fit", "--config", cfg]) == 0
    assert SEEN == [SECRET]  # the run itself got the value
    written = [os.path.join(d, n) for d, _, names in os.walk(tmp_path / "runs") for n in names]
    assert any(p.endswith(".ckpt") for p in written) and any("tfevents" in p for p in written)
    assert any(p.endswith("config.yaml") for p in written) and any(
        p.endswith("hparams.yaml") for p in written
    )
    assert _files_holding(tmp_path / "runs", SECRET) == []

    saved = os.path.join(tmp_path, "runs", "csv", "version_0", "config.yaml")
    text = open(saved).read()
    assert "token: ${oc.env:API_KEY}" in text and "https://bot:${oc.env:API_KEY}@example.org/v1" in text
    assert C.resolve(saved)["task"]["token"] == SECRET  # read back: from the environment again
    ckpt = torch.load(os.path.join(tmp_path, "runs", "csv", "version_0", "checkpoints", "last.ckpt"))
    assert ckpt["hyper_parameters"]["token"] == "${oc.env:API_KEY}"
    assert ckpt["config"]["task"]["endpoint"] == "https://bot:${oc.env:API_KEY}@example.org/v1"

    capsys.readouterr()
    assert main(["fit", "--config", cfg, "--print-config"]) == 0
    printed = capsys.readouterr().out
    assert SECRET not in printed and "${oc.env:API_KEY}" in printed


def test_a_resume_warns_nothing_and_load_from_checkpoint_asks_for_the_secret(tmp_path, monkeypatch, recwarn):
    monkeypatch.setenv("API_KEY", SECRET)
    cfg = _config(tmp_path)
    assert main(["fit", "--config", cfg]) == 0
    saved = os.path.join(tmp_path, "runs", "csv", "version_0", "config.yaml")
    assert main(["fit", "--config", saved, "--ckpt-path", "last", "trainer.max_steps=5"]) == 0
    assert not [w for w in recwarn if "other hyperparameters" in str(w.message)]
    assert _files_holding(tmp_path / "runs", SECRET) == []
    last = os.path.join(tmp_path, "runs", "csv", "version_1", "checkpoints", "last.ckpt")
    with pytest.raises(CheckpointError, match="token=.*endpoint=|endpoint=.*token="):
        SecretTask.load_from_checkpoint(last)
    task = SecretTask.load_from_checkpoint(last, token=SECRET, endpoint="https://example.org")
    assert task.hparams.token == SECRET


def test_short_and_unset_values_are_no_secrets(monkeypatch):
    from trainer.secrets import env_values, redact

    monkeypatch.setenv("FLAG", "1")
    monkeypatch.delenv("UNSET_FOR_TEST", raising=False)
    monkeypatch.setenv("KEY", SECRET)
    cfg = C.load({"a": "${oc.env:FLAG}", "b": "${oc.env:UNSET_FOR_TEST,default-value}", "c": "${oc.env:KEY}"})
    found = env_values(cfg)
    assert found == {SECRET: "${oc.env:KEY}"}
    monkeypatch.setenv("RUNS", "/data/runs")  # with a default: the saved text keeps it
    assert env_values(C.load({"root": "${oc.env:RUNS,runs}/digits"})) == {"/data/runs": "${oc.env:RUNS,runs}"}
    assert redact({"x": [f"a{SECRET}b", 1, (SECRET,)]}, found) == {
        "x": ["a${oc.env:KEY}b", 1, ("${oc.env:KEY}",)]
    }
