"""The strategy of docs/strategies/writing.md (examples/local_sgd.py) runs as written: alone it
trains as one device; at two ranks averaging every step trains as strategy="ddp" (plain SGD: the update is
linear in the gradient), and averaging every third step leaves the replicas apart between averages."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from callbacks import Callback
from examples.local_sgd import LocalSGDStrategy
from strategies import DDPStrategy
from tandem_core.errors import ConfigError
from trainer import Task, Trainer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Net(Task):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.net = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Spread(Callback):
    """Per step: the largest difference between the two replicas' weights (its state comes back from a fork)."""

    def __init__(self) -> None:
        self.spread: list[float] = []

    def on_train_batch_end(self, trainer, task, outputs, batch, batch_idx):
        if trainer.world_size > 1:
            both = trainer.strategy.all_gather(weights(task))
            self.spread.append(float((both[0] - both[1]).abs().max()))

    def state_dict(self):
        return {"spread": self.spread}

    def load_state_dict(self, state):
        self.spread = state["spread"]


def loader() -> DataLoader:
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(48, 6, generator=g), torch.randint(0, 3, (48,), generator=g))
    return DataLoader(data, batch_size=4)


def fit(strategy, devices: int = 1) -> tuple[Net, list[float]]:
    task, spread = Net(), Spread()
    Trainer(
        strategy=strategy, devices=devices, accelerator="cpu", max_epochs=1, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, callbacks=[spread],
    ).fit(task, loader())  # fmt: skip
    return task, spread.spread


def weights(task: Net) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in task.parameters()])


def test_alone_it_trains_as_one_device():
    alone, _ = fit(LocalSGDStrategy(average_every=2))
    single, _ = fit("single")
    assert torch.equal(weights(alone), weights(single))


def test_a_bad_period_is_refused_with_the_fix():
    with pytest.raises(ConfigError, match="average_every=0"):
        LocalSGDStrategy(average_every=0)


def two_rank_runs() -> None:
    """The three two-rank fits, in a fresh process (the forked workers need one that never joined a group);
    prints what the test checks as JSON."""
    ddp, _ = fit(DDPStrategy(start_method="fork"), devices=2)
    every, every_spread = fit(LocalSGDStrategy(average_every=1, start_method="fork"), devices=2)
    third, third_spread = fit(LocalSGDStrategy(average_every=3, start_method="fork"), devices=2)
    print(json.dumps({
        "every_vs_ddp": float((weights(every) - weights(ddp)).abs().max()),
        "third_vs_ddp": float((weights(third) - weights(ddp)).abs().max()),
        "every_spread": every_spread, "third_spread": third_spread,
    }))  # fmt: skip


@pytest.mark.slow
def test_at_two_ranks_it_averages_as_ddp_every_step_and_drifts_between_averages():
    code = "import tests.test_strategy_example as t; t.two_rank_runs()"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["every_vs_ddp"] < 1e-6
    assert max(got["every_spread"]) == 0.0  # the replicas are one after every step
    assert len(got["third_spread"]) == 6  # 48 samples, 2 ranks, batches of 4
    assert [s == 0.0 for s in got["third_spread"]] == [False, False, True] * 2
    assert got["third_vs_ddp"] > 1e-4  # less communication is another algorithm
