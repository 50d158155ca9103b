"""Several loaders under strategy="ddp" on two gloo ranks, in one spawn: each inner training loader gets its own
DistributedSampler (Lightning's CombinedLoader over the per-rank samplers gives the same batches, epoch after
epoch), each validation loader of a dict its evaluation shard, the ranks end with equal weights, a run
stopped inside a combined epoch and resumed equals the uninterrupted one on every rank, and fsdp shards the
inner loaders as ddp does."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch
from conftest import FAST, run_distributed
from pytorch_lightning.utilities import CombinedLoader as LightningCombined
from test_multiple_loaders import Noisy, SaveAndCrash, loader, plain
from torch.utils.data import DataLoader, DistributedSampler, Subset

from trainer import Trainer, seed_everything

SEED, EPOCHS = 7, 2


def train_loaders() -> dict[str, DataLoader]:
    return {
        "a": loader(7, 2, shuffle=True),
        "b": loader(18, 2, 100, shuffle=True),
    }  # per rank: 2 and 5 batches


def val_loaders() -> dict[str, Any]:
    return {"v": loader(5, 2, 300), "w": [loader(3, 1, 400)]}


def _fit(
    rank: int, callbacks: list, ckpt: str | None = None, rng: int = 0, strategy: str = "ddp"
) -> dict[str, Any]:
    seed_everything(SEED)
    task = Noisy()
    torch.manual_seed(rng + rank)
    trainer = Trainer(strategy=strategy, devices=2, max_epochs=EPOCHS, callbacks=callbacks, **FAST)
    try:
        trainer.fit(task, train_loaders(), val_loaders(), ckpt_path=ckpt)
    except Exception as e:  # the Crash of SaveAndCrash
        if type(e).__name__ != "Crash":
            raise
    return {
        "train": task.seen["train"], "val": task.seen["val"], "n": trainer.num_training_batches,
        "n_val": list(trainer.num_val_batches), "state": {k: v.clone() for k, v in task.state_dict().items()},
    }  # fmt: skip


def _runs(rank: int, world_size: int, tmp: str) -> dict[str, Any]:
    path = os.path.join(tmp, "mid.ckpt")
    return {
        "full": _fit(rank, []),
        "stopped": _fit(rank, [SaveAndCrash(path, (1, 3))]),  # "a" (2 batches per rank) cycled at batch 2
        "resumed": _fit(rank, [], ckpt=path, rng=99),
        "fsdp": _fit(rank, [], strategy="fsdp"),
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> list[dict[str, Any]]:
    return run_distributed(_runs, str(tmp_path_factory.mktemp("multi_ddp")), timeout=240)


def _expected_train(rank: int) -> list[Any]:
    """Lightning's CombinedLoader ("max_size_cycle") over each loader rebuilt with its DistributedSampler."""
    out = []
    for epoch in range(EPOCHS):
        sharded = {}
        for key, dl in train_loaders().items():
            sampler = DistributedSampler(dl.dataset, num_replicas=2, rank=rank, shuffle=True, seed=SEED)
            sampler.set_epoch(epoch)
            sharded[key] = DataLoader(dl.dataset, batch_size=2, sampler=sampler)
        out += [(i, plain(b)) for b, i, _ in LightningCombined(sharded, "max_size_cycle")]
    return out


@pytest.mark.slow
def test_each_inner_loader_is_sharded_and_ranks_agree(runs):
    for rank, r in enumerate(runs):
        full = r["full"]
        assert full["n"] == 5 and full["train"] == _expected_train(rank), rank
        want_val, want_n = [], []
        for idx, dl in enumerate([val_loaders()["v"], val_loaders()["w"][0]]):  # dataloader_idx 0 and 1
            shard = DataLoader(Subset(dl.dataset, range(rank, len(dl.dataset), 2)), batch_size=dl.batch_size)
            want_val += [(idx, i, plain(b)) for i, b in enumerate(shard)]
            want_n.append(len(shard))
        assert full["val"] == want_val * EPOCHS and full["n_val"] == want_n == [[2, 2], [1, 1]][rank]
        for name, value in full["state"].items():
            assert torch.equal(value, runs[0]["full"]["state"][name]), name
    assert runs[0]["full"]["train"] != runs[1]["full"]["train"]


@pytest.mark.slow
def test_fsdp_shards_each_inner_loader_as_ddp_does(runs):
    for r in runs:
        assert r["fsdp"]["train"] == r["full"]["train"] and r["fsdp"]["val"] == r["full"]["val"]
        assert r["fsdp"]["n"] == r["full"]["n"]


@pytest.mark.slow
def test_resume_inside_a_combined_epoch_on_every_rank(runs):
    for rank, r in enumerate(runs):
        assert r["stopped"]["train"] + r["resumed"]["train"] == r["full"]["train"], rank
        assert r["resumed"]["train"][0][0] == 4
        for name, value in r["full"]["state"].items():
            assert torch.equal(r["resumed"]["state"][name], value), (rank, name)
