"""callbacks.monitor: comparisons, when a monitor acts, the missing-key policy, and one decision for all ranks."""

from __future__ import annotations

import math
import os
import random
import warnings
from types import SimpleNamespace

import pytest
import torch
from callback_tasks import QUIET, Scored, loader
from torch.utils.data import DataLoader

from callbacks import EarlyStopping, ModelCheckpoint
from callbacks.monitor import Monitor, any_rank_wants, at_train_epoch_end, rank_zero_decides
from tandem_core.errors import ConfigError
from trainer import Trainer


def fake_trainer(**overrides):
    """The attributes of a Trainer that callbacks.monitor reads."""
    config = SimpleNamespace(val_check_interval=1.0, check_val_every_n_epoch=1)
    fields = dict(
        config=config,
        val_dataloaders=[object()],
        num_val_batches=[2],
        callback_metrics={"train/loss": 1.0},
        is_global_zero=True,
        stage="fit",
        sanity_checking=False,
        world_size=1,
        strategy=None,
    )
    fields.update(overrides)
    return SimpleNamespace(**fields)


@pytest.mark.parametrize("mode", ["min", "max"])
def test_comparisons_agree_with_sorting(mode):
    rng = random.Random(0)
    m = Monitor("Test", "x", mode, min_delta=0.25)
    sign = 1 if mode == "min" else -1  # sorting by sign * value puts the best first
    for _ in range(200):
        scores = {f"p{i}": rng.choice([rng.uniform(-3, 3), round(rng.uniform(-3, 3))]) for i in range(5)}
        ranked = sorted(scores, key=lambda k: sign * scores[k])
        assert scores[m.best_of(scores)] == scores[ranked[0]]
        assert scores[m.worst_of(scores)] == scores[ranked[-1]]
        a, b = rng.uniform(-3, 3), rng.uniform(-3, 3)
        assert m.better(a, b) == (sign * a < sign * b)
        assert m.improves(a, b) == (sign * (b - a) > 0.25)
    assert m.better(0.0, None) and m.improves(1e300, m.worst)
    assert m.score(math.nan) == m.worst and not m.better(m.score(math.nan), 0.0)
    with pytest.raises(ConfigError, match="Test mode"):
        Monitor("Test", "x", "best")


@pytest.mark.parametrize(
    ("override", "val", "interval", "every", "expected"),
    [
        (None, True, 1.0, 1, True),  # validation ends every epoch: act once, at the epoch end
        (None, True, 0.5, 1, False),  # validation inside the epoch: act after each one
        (None, True, 1.0, 2, False),  # every second epoch: act after each validation
        (None, False, 1.0, 2, True),  # no validation at all: only the epoch end is left
        (None, False, 0.5, 1, True),
        (False, False, 1.0, 1, False),  # the user's choice wins
        (True, True, 0.5, 3, True),
    ],
)
def test_when_a_monitor_acts(override, val, interval, every, expected):
    trainer = fake_trainer(
        config=SimpleNamespace(val_check_interval=interval, check_val_every_n_epoch=every),
        val_dataloaders=[object()] if val else None,
    )
    assert at_train_epoch_end(trainer, override) is expected


def test_missing_key_waits_for_the_first_validation_then_raises_or_warns():
    trainer = fake_trainer()
    m = Monitor("Owner", "val/x")
    with pytest.warns(UserWarning, match=r"Owner\(monitor='val/x'\).*'train/loss'.*Skipping this save") as w:
        assert m.value(trainer, action="save") is None
        assert m.value(trainer, action="save") is None
    assert len(w) == 1  # once, not at every step
    m.validation_ended(fake_trainer(sanity_checking=True))  # the sanity check does not count
    with pytest.warns(UserWarning):
        m.value(trainer, action="other")
    m.validation_ended(trainer)
    with pytest.raises(ConfigError, match=r"never logged; logged keys: \['train/loss'\]"):
        m.value(trainer)
    with pytest.warns(UserWarning, match="val/x") as w:
        assert m.value(trainer, strict=False) is None
    assert "Skipping" not in str(w[0].message)
    m.start()  # a new fit: wait again
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert m.value(fake_trainer(is_global_zero=False)) is None  # other ranks stay quiet
    with pytest.raises(ConfigError):  # no validation: the key can never appear
        Monitor("Owner", "val/x").value(fake_trainer(val_dataloaders=None))
    assert Monitor("Owner", "train/loss").value(trainer) == 1.0


class TwoRanks:
    """A strategy stand-in for rank 1 of two: broadcast returns rank 0's value, reduce sees rank 0's flag
    (it is its own `comm`)."""

    root_device = torch.device("cpu")

    def __init__(self, rank0_value, rank0_flag=False):
        self.rank0_value, self.rank0_flag, self.calls = rank0_value, rank0_flag, []
        self.comm = self

    def broadcast(self, obj, src=0):
        self.calls.append(("broadcast", src))
        return self.rank0_value

    def reduce(self, tensor, op="mean"):
        self.calls.append(("reduce", op))
        return torch.maximum(tensor, torch.tensor(float(self.rank0_flag)))


def test_rank_zero_decides_and_any_rank_wants():
    strategy = TwoRanks({"val/x": 0.5}, rank0_flag=True)
    trainer = fake_trainer(world_size=2, strategy=strategy)
    assert rank_zero_decides(trainer, {"val/x": 0.9}) == {"val/x": 0.5}
    assert any_rank_wants(trainer, False) is True
    assert strategy.calls == [("broadcast", 0), ("reduce", "max")]
    alone = TwoRanks(None)
    assert rank_zero_decides(fake_trainer(strategy=alone), 7) == 7 and alone.calls == []  # one process
    assert any_rank_wants(fake_trainer(world_size=2, strategy=TwoRanks(None)), False) is False


def _ddp_run(rank: int, world_size: int, root: str) -> dict[str, object]:
    from test_metrics import StepSyncTask, SyncTask, data

    from strategies.ddp import DDPStrategy

    # 1. validate: torchmetrics syncs itself, sync_dist=True reduces the logged mean (12 samples per rank)
    trainer = Trainer(strategy=DDPStrategy(accelerator="cpu", devices=world_size), **QUIET)
    (metrics,) = trainer.validate(SyncTask(), DataLoader(data(24, seed=2), batch_size=5))
    # 2. fit: rank 1 stops improving after epoch 0, rank 0 keeps improving: both must stop at epoch 1
    scores = [5.0, 4.0, 3.0, 2.0, 1.0, 0.0] if rank == 0 else [5.0, 6.0, 7.0, 8.0, 9.0, 10.0]
    es = EarlyStopping("val/score", patience=1)
    ck = ModelCheckpoint(dirpath=root, monitor="val/score", save_top_k=1)
    trainer = Trainer(
        strategy=DDPStrategy(accelerator="cpu", devices=world_size), max_epochs=6, callbacks=[es, ck], **QUIET
    )
    trainer.fit(Scored(scores), loader(), loader(4, 2))
    # 3. sync_dist on step values (at once, over a group, never with rank_zero_only); group and sync_grads
    steps = StepSyncTask()
    Trainer(strategy=DDPStrategy(accelerator="cpu", devices=world_size), max_steps=2, **QUIET).fit(
        steps, DataLoader(data(16, seed=rank), batch_size=4)
    )
    return {
        "steps": steps.seen,
        "collectives": steps.extra,
        "epoch": trainer.current_epoch,
        "step": trainer.global_step,
        "best": ck.best_model_path,
        "score": ck.best_model_score.item(),
        "metrics": metrics,
    }


def test_ddp_metrics_sync_ranks_stop_together_and_agree_on_the_best_checkpoint(dist_run, tmp_path):
    """One 2-process run (spawning is the slow part) for every cross-rank promise of logging and callbacks."""
    pytest.importorskip("strategies.ddp")
    from test_metrics import SyncTask, data

    (single,) = Trainer(**QUIET).validate(SyncTask(), DataLoader(data(24, seed=2), batch_size=5))
    r0, r1 = dist_run(_ddp_run, str(tmp_path))
    for r in (r0, r1):  # torchmetrics accuracy and the sync_dist mean equal the single-process values
        assert r["metrics"]["val/acc"] == pytest.approx(single["val/acc"], abs=1e-6)
        assert r["metrics"]["val/loss"] == pytest.approx(single["val/loss"], abs=1e-5)
    for rank, r in enumerate((r0, r1)):  # Lightning's step values: reduced on every rank, or this rank's own
        assert r["steps"] == [
            {"s/mean": 1.5 * b, "s/max": 2.0 * b, "s/group": 1.5 * b, "s/rank_zero_only": (rank + 1.0) * b,
             "s/local": (rank + 1.0) * b}
            for b in (1, 2)
        ]  # fmt: skip
        assert r["collectives"] == {
            "gathered": [1.0, 2.0],
            "grad": 3.0,
            "group_sum": 3.0,
            "group_gather": [1.0, 2.0],
        }
        del r["steps"]
    assert r0 == r1
    assert r0["epoch"] == 2 and r0["score"] == 4.0  # rank 0's metric decides which file is best
    assert os.listdir(tmp_path) == [os.path.basename(r0["best"])]
