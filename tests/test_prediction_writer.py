"""BasePredictionWriter: each batch's prediction with its dataset indices, or all of them at the end; under
ddp x2 the two processes' writers together write every prediction exactly once (slow)."""

from __future__ import annotations

import os

import pytest
import torch
from conftest import FAST
from torch.utils.data import DataLoader, TensorDataset

from callbacks import BasePredictionWriter
from tandem_core.errors import ConfigError
from trainer import Task, Trainer

N = 22


class Doubler(Task):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(1))

    def forward(self, x):
        return 2 * x * self.w


class Writer(BasePredictionWriter):
    def __init__(self, out: str, interval: str = "batch") -> None:
        super().__init__(interval)
        self.out = out

    def write_on_batch_end(self, trainer, task, prediction, batch_indices, batch, batch_idx, dataloader_idx):
        torch.save(
            {"idx": list(batch_indices), "pred": prediction},
            f"{self.out}/r{trainer.global_rank}-b{batch_idx}.pt",
        )

    def write_on_epoch_end(self, trainer, task, predictions, batch_indices):
        torch.save({"idx": batch_indices, "pred": predictions}, f"{self.out}/r{trainer.global_rank}-all.pt")


def samples() -> DataLoader:
    x = torch.arange(N, dtype=torch.float32).unsqueeze(1)
    return DataLoader(
        TensorDataset(x), batch_size=4, shuffle=True
    )  # shuffled: the indices say which is which


def _collect(out: str) -> dict[int, float]:
    got: dict[int, float] = {}
    for name in os.listdir(out):
        if "-b" in name:
            item = torch.load(os.path.join(out, name), weights_only=True)
            for i, p in zip(item["idx"], item["pred"].flatten().tolist()):
                assert i not in got, f"sample {i} written twice"
                got[i] = p
    return got


def test_batches_come_with_their_dataset_indices(tmp_path):
    torch.manual_seed(0)
    Trainer(callbacks=[Writer(str(tmp_path), "batch_and_epoch")], **FAST).predict(
        Doubler(), samples(), return_predictions=False
    )
    assert _collect(str(tmp_path)) == {i: 2.0 * i for i in range(N)}
    whole = torch.load(tmp_path / "r0-all.pt", weights_only=True)
    assert len(whole["idx"]) == 1 and sum(len(b) for b in whole["idx"][0]) == N  # per loader, per batch
    assert [p.shape[0] for p in whole["pred"]] == [4, 4, 4, 4, 4, 2]


def test_interval_is_checked():
    with pytest.raises(ConfigError, match="write_interval"):
        BasePredictionWriter("step")


def _ddp_predict(rank: int, world_size: int, out: str) -> None:
    trainer = Trainer(strategy="ddp", devices=2, callbacks=[Writer(out)], **FAST)
    trainer.predict(Doubler(), samples(), return_predictions=False)


@pytest.mark.slow
def test_ddp_x2_writes_every_prediction_once(tmp_path, dist_run):
    dist_run(_ddp_predict, str(tmp_path))
    got = _collect(str(tmp_path))
    assert got == {i: 2.0 * i for i in range(N)}
    assert {n.split("-")[0] for n in os.listdir(tmp_path)} == {"r0", "r1"}  # both processes wrote
