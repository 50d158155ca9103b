"""trainer/loggers/base.py: run-directory versions, loggers that share a directory, the Logger contract
a custom logger relies on (what the Trainer calls, with what), and the hyperparameter conversions."""

from __future__ import annotations

import os
import pathlib
from typing import Any

import pytest
import torch
import torch.nn.functional as F
import yaml
from conftest import QUIET
from torch.utils.data import DataLoader, TensorDataset

from trainer import Task, Trainer
from trainer.loggers import CSVLogger, Logger, TensorBoardLogger, align_versions
from trainer.loggers.base import flatten, next_version, yaml_safe


def test_next_version_counts_only_version_directories(tmp_path):
    assert next_version(str(tmp_path / "missing")) == 0
    assert next_version(str(tmp_path)) == 0
    for name in ("version_0", "version_2", "version_x", "old_version_9", "version_10.bak"):
        (tmp_path / name).mkdir()
    assert next_version(str(tmp_path)) == 3  # after the highest N, gaps are not reused


def test_version_is_chosen_once_at_first_use(tmp_path):
    first = Logger(tmp_path, name="exp")
    assert first.root_dir == os.path.join(str(tmp_path), "exp")
    assert first.version == 0
    assert os.path.isdir(first.log_dir)  # claimed: created at the first use, so no other run can take it
    assert first.version == 0 and first.log_dir == os.path.join(str(tmp_path), "exp", "version_0")
    assert Logger(tmp_path, name="exp").version == 1  # the next run takes the next directory


def test_fixed_versions_and_no_name(tmp_path):
    (tmp_path / "version_0").mkdir()
    assert Logger(tmp_path, name="exp", version=7).log_dir == os.path.join(str(tmp_path), "exp", "version_7")
    assert Logger(tmp_path, name="exp", version="best").log_dir == os.path.join(str(tmp_path), "exp", "best")
    unnamed = Logger(pathlib.Path(tmp_path), name=None)
    assert os.path.normpath(unnamed.root_dir) == str(tmp_path)  # versions directly under save_dir
    assert unnamed.version == 1 and isinstance(unnamed.save_dir, str)


def test_align_versions_gives_loggers_of_one_directory_the_same_next_version(tmp_path):
    for n in range(2):
        (tmp_path / "shared" / f"version_{n}").mkdir(parents=True)
    (tmp_path / "alone" / "version_4").mkdir(parents=True)
    tb, csv_logger = TensorBoardLogger(str(tmp_path), name="shared"), CSVLogger(str(tmp_path), name="shared")
    fixed = CSVLogger(str(tmp_path), name="shared", version=0)
    alone = Logger(tmp_path, name="alone")
    loggers = [tb, alone, csv_logger, fixed]
    assert align_versions(loggers) == loggers
    assert tb.version == csv_logger.version == 2 and tb.log_dir == csv_logger.log_dir
    assert fixed.version == 0  # a version the user gave is kept
    assert alone._version is None and alone.version == 5  # nobody to agree with: chosen at first use


def test_a_trainer_with_two_loggers_writes_one_version_directory(tmp_path):
    loggers = [TensorBoardLogger(str(tmp_path)), CSVLogger(str(tmp_path))]
    trainer = Trainer(**{**QUIET, "logger": loggers}, max_steps=1)
    trainer.fit(Linear(), loader())
    assert os.listdir(os.path.join(str(tmp_path), "lightning_logs")) == ["version_0"]


# ----- the contract of a custom logger ----------------------------------------------------------------------
class Memory(Logger):
    """A custom logger that keeps everything the Trainer sends it."""

    def __init__(self) -> None:
        super().__init__(save_dir="unused")
        self.rows: list[tuple[int, dict[str, float]]] = []
        self.hparams: list[tuple[dict[str, Any], dict[str, float] | None]] = []
        self.events: list[str] = []

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.rows.append((step, dict(metrics)))

    def log_hyperparams(self, params: dict[str, Any], metrics: dict[str, float] | None = None) -> None:
        self.hparams.append((params, metrics))

    def save(self) -> None:
        self.events.append("save")

    def finalize(self, status: str) -> None:
        self.events.append(status)
        super().finalize(status)


class Linear(Task):
    """A linear regression that logs its loss and can fail at a chosen step."""

    def __init__(self, lr: float = 0.1, fail_at: int = -1) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.lin = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        if self.global_step == self.hparams.fail_at:
            raise RuntimeError("deliberate")
        x, y = batch
        loss = F.mse_loss(self.lin(x), y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


def loader() -> DataLoader:
    """4 batches of 2."""
    g = torch.Generator().manual_seed(0)
    return DataLoader(
        TensorDataset(torch.randn(8, 2, generator=g), torch.randn(8, 1, generator=g)), batch_size=2
    )


def _fit(task: Task, logger: Memory) -> Trainer:
    """One epoch, logging every step."""
    trainer = Trainer(**{**QUIET, "logger": logger}, max_epochs=1, log_every_n_steps=1)
    trainer.fit(task, loader())
    return trainer


def test_a_custom_logger_gets_hparams_at_the_start_then_floats_at_each_step_and_success():
    logger = Memory()
    trainer = _fit(Linear(), logger)
    assert [step for step, _ in logger.rows] == [0, 1, 2, 3]  # Lightning's: the steps before the logged one
    for _, metrics in logger.rows:
        assert all(type(v) is float for k, v in metrics.items() if k != "epoch")
        assert type(metrics["epoch"]) is int  # as Lightning adds it
    assert logger.rows[-1][1]["loss"] == pytest.approx(float(trainer.callback_metrics["loss"]))
    assert logger.hparams == [({"lr": 0.1, "fail_at": -1}, None)]  # at fit's start, as Lightning
    # saved right after the hyperparameters (Lightning's), then finalize once; the base class's finalize saves
    assert logger.events == ["save", "success", "save"]


def test_a_failed_run_finalizes_its_logger_as_failed():
    logger = Memory()
    with pytest.raises(RuntimeError, match="deliberate"):
        _fit(Linear(fail_at=2), logger)
    assert [step for step, _ in logger.rows] == [0, 1]
    assert logger.hparams == [({"lr": 0.1, "fail_at": 2}, None)]  # written before the failure
    assert logger.events == ["save", "failed", "save"]


def test_the_base_logger_needs_log_metrics():
    with pytest.raises(NotImplementedError):
        Logger().log_metrics({"a": 1.0}, step=0)


# ----- conversions of hyperparameters -----------------------------------------------------------------------
def test_flatten_joins_nested_keys_and_stringifies_the_rest():
    params = {"opt": {"lr": 0.1, "betas": (0.9, 0.99), "sched": {"name": "cos"}}, "seed": None, "amp": True}
    assert flatten(params) == {
        "opt/lr": 0.1,
        "opt/betas": "(0.9, 0.99)",
        "opt/sched/name": "cos",
        "seed": "None",
        "amp": True,
    }
    assert flatten({"a": 1}, prefix="hp/") == {"hp/a": 1}


def test_plain_makes_anything_safe_for_yaml():
    params = {"dims": (3, [4, 5]), 7: {"path": pathlib.Path("/data"), "none": None}, "dtype": torch.float16}
    expected = {"dims": [3, [4, 5]], "7": {"path": "/data", "none": None}, "dtype": "torch.float16"}
    assert yaml_safe(params) == expected
    assert yaml.safe_load(yaml.safe_dump(yaml_safe(params))) == expected
