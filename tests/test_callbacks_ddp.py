"""Under ddp x2 (two gloo processes) each callback does what one process on the whole batch does, or refuses
under fsdp with why: SWA, EMA, finetuning and the accumulation scheduler end with the single process's
weights (and averages) on both ranks; random pruning draws one mask for both; lr_find suggests one rate; a
spike on one rank stops both. All slow (multi-process)."""

from __future__ import annotations

import pytest
import torch
from averaging_tasks import Regress, dataset
from conftest import FAST
from test_finetuning import Trainable
from torch.utils.data import DataLoader

from callbacks import (
    BackboneFinetuning,
    Callback,
    EMAWeightAveraging,
    GradientAccumulationScheduler,
    ModelPruning,
    SpikeDetection,
    StochasticWeightAveraging,
)
from callbacks.spike import TrainingSpikeException
from tandem_core.errors import ConfigError
from trainer import Trainer, Tuner

pytestmark = pytest.mark.slow
EPOCHS = 4


def _callbacks() -> dict[str, list[Callback]]:
    return {
        "swa": [StochasticWeightAveraging(swa_lrs=0.02, swa_epoch_start=2)],
        "ema": [EMAWeightAveraging(decay=0.9)],
        "finetune": [BackboneFinetuning(unfreeze_backbone_at_epoch=1)],
        "accumulate": [GradientAccumulationScheduler({1: 2, 3: 4})],
    }


def _run(name: str, batch_size: int, **options) -> dict[str, torch.Tensor]:
    """Fit with `name`'s callback on unshuffled data: under ddp x2 each rank's batch of 8 is half of the
    single process's batch of 16 (the same samples)."""
    torch.manual_seed(0)
    task = Trainable()
    trainer = Trainer(max_epochs=EPOCHS, callbacks=_callbacks()[name], **{**FAST, **options})
    trainer.fit(task, DataLoader(dataset(), batch_size=batch_size))
    out = {f"w.{k}": v.detach().clone() for k, v in task.state_dict().items()}
    avg = getattr(trainer.callbacks[0], "_average_model", None)
    if avg is not None:  # the average kept by SWA / EMA (its parameters)
        out.update({f"avg.{i}": p.detach().clone() for i, p in enumerate(avg.parameters())})
    return out


def _in_group(rank: int, world: int) -> dict[str, object]:
    out: dict[str, object] = {name: _run(name, 8, strategy="ddp", devices=2) for name in _callbacks()}
    torch.manual_seed(rank)  # a different generator on each rank: random pruning must still agree
    task = Regress()
    Trainer(max_epochs=2, callbacks=[ModelPruning("random_unstructured", amount=0.5, make_pruning_permanent=False)],
            strategy="ddp", devices=2, **FAST).fit(task, DataLoader(dataset(), batch_size=8))  # fmt: skip
    out["masks"] = [b.clone() for n, b in task.named_buffers() if n.endswith("_mask")]
    out["pruned"] = {k: v.clone() for k, v in task.state_dict().items()}
    torch.manual_seed(0)
    lr_task = Regress()
    finder = Tuner(Trainer(strategy="ddp", devices=2, **FAST)).lr_find(
        lr_task, DataLoader(dataset(), batch_size=8, shuffle=True), num_training=16
    )
    out["lr"], out["lr_task"] = finder.suggestion(), {k: v.clone() for k, v in lr_task.state_dict().items()}
    return out


def test_callbacks_under_ddp_equal_one_process_on_the_whole_batch(dist_run):
    ranks = dist_run(_in_group)
    for name in _callbacks():
        single = _run(name, 16)
        for rank in ranks:
            assert sorted(rank[name]) == sorted(single)
            for k, v in single.items():
                assert torch.allclose(rank[name][k], v, atol=1e-6), (
                    name,
                    k,
                    float((rank[name][k] - v).abs().max()),
                )
    zero, one = ranks
    assert all(torch.equal(a, b) for a, b in zip(zero["masks"], one["masks"])) and zero["masks"]
    assert all(torch.equal(zero["pruned"][k], one["pruned"][k]) for k in zero["pruned"])
    torch.manual_seed(0)
    assert zero["lr"] == one["lr"] is not None
    assert all(torch.equal(zero["lr_task"][k], v) for k, v in Regress().state_dict().items())  # restored


class SpikeOnRankOne(Regress):
    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        return loss * 1000 if batch_idx == 5 and self.global_rank == 1 else loss


def _spike(rank: int, world: int, root: str) -> str:
    trainer = Trainer(
        max_epochs=1,
        callbacks=[SpikeDetection(rtol=20.0)],
        strategy="ddp",
        devices=2,
        default_root_dir=root,  # skip_batches.json goes there, not into the working directory
        **FAST,
    )
    try:
        trainer.fit(SpikeOnRankOne(), DataLoader(dataset(), batch_size=4))
    except TrainingSpikeException as e:
        return str(e)
    return "no spike"


def test_a_spike_on_one_rank_stops_both(dist_run, tmp_path):
    assert dist_run(_spike, str(tmp_path)) == ["Training spike detected in batch 5"] * 2


def _fsdp_refusals(rank: int, world: int) -> list[str]:
    out = []
    for cb in (StochasticWeightAveraging(swa_lrs=0.1), EMAWeightAveraging(), ModelPruning("l1_unstructured")):
        try:
            Trainer(max_epochs=1, callbacks=[cb], strategy="fsdp", devices=2, **FAST).fit(
                Regress(), DataLoader(dataset(), batch_size=8)
            )
            out.append("ran")
        except ConfigError as e:
            out.append(str(e))
    return out


def test_averaging_and_pruning_refuse_fsdp_with_the_reason(dist_run):
    for messages in dist_run(_fsdp_refusals):
        assert all("shard" in m and "ddp" in m for m in messages), messages


def _fsdp_finetune(rank: int, world: int) -> dict[str, torch.Tensor]:
    out = _run("finetune", 8, strategy="fsdp", devices=2)
    return {
        k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in out.items()
    }  # whole, on every rank


def test_finetuning_under_fsdp_equals_one_process(dist_run):
    single = _run("finetune", 16)
    for rank in dist_run(_fsdp_finetune):
        for k, v in single.items():
            assert torch.allclose(rank[k], v, atol=1e-6), (k, float((rank[k] - v).abs().max()))
