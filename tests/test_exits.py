"""Clean exits (issue 24): a run that succeeded exits 0, for every strategy and every way its process group
came to exist (Tandem's, the user's, torchrun's). The slow test runs tests/scripts/stress_exits.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from conftest import FAST, free_port
from torch.utils.data import DataLoader, TensorDataset

from strategies import process_group
from trainer import Task, Trainer

HERE = os.path.dirname(os.path.abspath(__file__))
STRESS = os.path.join(HERE, "scripts", "stress_exits.py")


class Tiny(Task):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(4, 2)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def native_threads() -> int:
    return len(os.listdir("/proc/self/task"))


def test_a_group_the_user_made_is_closed_at_exit(monkeypatch):
    """Regression: a script that called init_process_group itself before fit aborted at exit ("terminate
    called without an active exception") once in three runs of a two-node job: Tandem registered the
    closing of the group (see _destroy_group) only for groups it made, so the user's gloo workers outlived
    the interpreter. Now the exit handler is registered for any group fit joins, and it joins the workers."""
    registered: list = []
    monkeypatch.setattr(process_group, "atexit", types.SimpleNamespace(register=registered.append))
    monkeypatch.setattr(process_group, "_closing", False, raising=False)  # registered once per process
    env = dict(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
    for k, v in dict(env, MASTER_PORT=str(free_port())).items():
        monkeypatch.setenv(k, v)
    if dist.is_initialized():  # an earlier test's devices=1 group of one lives on in this process
        dist.destroy_process_group()
    torch.randn(256, 256) @ torch.randn(256, 256)  # start the OpenMP workers first: not the group's threads
    before = native_threads()
    dist.init_process_group("gloo")  # the user's own group, as torchrun's env:// gives it
    try:
        data = TensorDataset(torch.randn(16, 4), torch.randint(0, 2, (16,)))
        trainer = Trainer(strategy="ddp", devices=1, max_steps=2, **FAST)
        trainer.fit(Tiny(), DataLoader(data, batch_size=4))
        assert dist.is_initialized() and native_threads() > before  # the user's group is still open
        assert registered == [process_group._destroy_group]
        del trainer
        registered[0]()  # what the interpreter runs at exit
        assert not dist.is_initialized()
        assert native_threads() == before  # its gloo worker threads were joined
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


@pytest.mark.slow
def test_short_fits_of_every_strategy_exit_zero(tmp_path):
    """A small version of the stress (5 runs of each kind under one busy loop; docs/reliability.md has the
    100-run numbers): every run exits 0."""
    out = tmp_path / "stress.json"
    cmd = [sys.executable, STRESS, "--runs", "5", "--out", str(tmp_path / "runs"), "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3000)
    results = json.loads(out.read_text())["results"]
    assert sorted(results) == sorted(("single", "dp", "ddp", "ddp-torchrun", "user-group", "fsdp"))
    for kind, r in results.items():
        assert r["runs"] == 5 and r["failures"] == 0, (kind, r, proc.stderr[-4000:])
    assert proc.returncode == 0, proc.stderr[-4000:]
