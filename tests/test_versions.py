"""version_N is claimed atomically (trainer/loggers/base.py): runs that start together under one root get
different directories, each with its own config.yaml and hparams.yaml; under several ranks rank 0 claims."""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest
import torch
import torch.nn.functional as F
import yaml
from conftest import FAST
from torch.utils.data import DataLoader, TensorDataset

from trainer import Task, Trainer
from trainer.config.save import SaveRunConfig
from trainer.loggers import CSVLogger, Logger, agree_versions, claim_version


class Tiny(Task):
    def __init__(self, run: int) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def together(n: int, fn: Any) -> list[Any]:
    """fn(i) on n threads released at the same instant by a barrier; the results in order."""
    barrier, results, errors = threading.Barrier(n), [None] * n, []

    def run(i: int) -> None:
        try:
            barrier.wait()
            results[i] = fn(i)
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return results


def test_loggers_started_together_claim_different_versions(tmp_path):
    (tmp_path / "exp" / "version_0").mkdir(parents=True)  # an earlier run
    versions = together(8, lambda i: Logger(tmp_path, name="exp").version)
    assert sorted(versions) == list(range(1, 9))
    assert sorted(os.listdir(tmp_path / "exp")) == sorted(f"version_{n}" for n in range(9))


def test_claim_skips_a_version_taken_between_listing_and_creating(tmp_path, monkeypatch):
    import trainer.loggers.base as base

    real = base.next_version

    def raced(root: str) -> int:
        n = real(root)
        os.mkdir(os.path.join(root, f"version_{n}"))  # another run claims it right after our listing
        return n

    monkeypatch.setattr(base, "next_version", raced)
    assert claim_version(str(tmp_path)) == 1


def test_trainers_started_together_keep_their_own_config_and_hparams(tmp_path):
    x = torch.randn(8, 2)
    data = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)

    def run(i: int) -> str:
        logger = CSVLogger(str(tmp_path), name="exp")
        cfg = {"trainer": {"max_steps": 1}, "run": i}
        trainer = Trainer(**{**FAST, "logger": logger}, callbacks=[SaveRunConfig(cfg)], max_steps=1)
        trainer.fit(Tiny(run=i), data)
        return trainer.log_dir

    dirs = together(2, run)
    assert len(set(dirs)) == 2
    for i, d in enumerate(dirs):
        with open(os.path.join(d, "config.yaml")) as f:
            assert yaml.safe_load(f)["run"] == i
        with open(os.path.join(d, "hparams.yaml")) as f:
            assert yaml.safe_load(f) == {"run": i}


class FakeComm:
    """Two ranks' view of strategy.comm: broadcast hands every rank what rank 0 sent."""

    world_size = 2

    def __init__(self, rank: int, sent: list[Any]) -> None:
        self.is_global_zero, self.sent = rank == 0, sent

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        if self.is_global_zero:
            self.sent.append(obj)
        return self.sent[-1]


def test_rank_zero_claims_and_every_rank_takes_its_version(tmp_path):
    (tmp_path / "exp" / "version_0").mkdir(parents=True)
    sent: list[Any] = []
    rank0 = [Logger(tmp_path, name="exp"), Logger(tmp_path, name="fixed", version=5)]
    rank1 = [Logger(tmp_path, name="exp"), Logger(tmp_path, name="fixed", version=5)]
    agree_versions(rank0, FakeComm(0, sent))
    agree_versions(rank1, FakeComm(1, sent))
    assert [lg.version for lg in rank1] == [lg.version for lg in rank0] == [1, 5]
    assert sorted(os.listdir(tmp_path / "exp")) == ["version_0", "version_1"]  # rank 1 created nothing


def _ddp_runs(rank: int, world_size: int, root: str) -> list[str]:
    """Two fits under DDP, one after the other: each rank's log_dir."""
    x = torch.randn(8, 2)
    data = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=2)
    dirs = []
    for steps in (1, 2):
        options = {**FAST, "enable_checkpointing": True, "logger": CSVLogger(root, name="exp")}
        trainer = Trainer(**options, strategy="ddp", devices=2, max_steps=steps, default_root_dir=root)
        trainer.fit(Tiny(run=0), data)
        dirs.append(trainer.log_dir)
    return dirs


@pytest.mark.slow  # two processes, about 40 s here
def test_ddp_ranks_share_the_version_rank_zero_claimed(tmp_path):
    from conftest import run_distributed

    rank0, rank1 = run_distributed(_ddp_runs, str(tmp_path))
    assert rank0 == rank1 and rank0[0] != rank0[1]
    assert sorted(os.listdir(tmp_path / "exp")) == ["version_0", "version_1"]  # no directory of rank 1's own
