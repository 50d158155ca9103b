"""tricks.py ("Effective Training Techniques"): the Tuner's learning-rate suggestion equals Lightning's on the
same seed and data (the number below was recorded by running this file with Lightning itself:
``python -m tests.ports.lightning_check -k tricks``); the batch-size finder under a simulated memory limit;
the page's EMA and SWA recipes against hand loops on torch.optim.swa_utils."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F
from torch.optim.swa_utils import SWALR, AveragedModel, get_ema_avg_fn
from torch.utils.data import DataLoader

from tests.ports.harness import QUIET, LazyPort, assert_same_weights, seed_all, weights

tricks = LazyPort("tricks")

QUICK = dict(QUIET, logger=False, enable_checkpointing=False, accelerator="cpu")
# Lightning 2.6.6's Tuner.lr_find on this seed and data (recorded with tests/ports/lightning_check.py)
LIGHTNING_SUGGESTION = 0.026101572156825372
LIGHTNING_POINTS = 60
LIGHTNING_LAST_LOSS = 1.9489999216096683  # the smoothed loss of the last step


def test_lr_find_suggests_what_lightning_suggests(tmp_path):
    tricks.seed_everything(1234)
    model = tricks.LitModel()
    trainer = tricks.Trainer(max_epochs=5, default_root_dir=str(tmp_path), **QUICK)
    finder = tricks.Tuner(trainer).lr_find(model, min_lr=1e-5, max_lr=1.0, num_training=60)
    suggestion, points, last = finder.suggestion(), len(finder.results["lr"]), finder.results["loss"][-1]
    expected = (
        pytest.approx(LIGHTNING_SUGGESTION, rel=1e-12),
        LIGHTNING_POINTS,
        pytest.approx(LIGHTNING_LAST_LOSS, rel=1e-5),
    )
    assert (suggestion, points, last) == expected, (suggestion, points, last)
    assert model.learning_rate == suggestion
    assert os.listdir(tmp_path) == []  # nothing written (Lightning removes its temporary checkpoint too)


def _limited(limit: int):
    class Limited(tricks.LitModel):
        """Runs out of memory (as the CPU allocator says it) on batches larger than `limit`."""

        def training_step(self, batch, batch_idx):
            if batch[0].shape[0] > limit:
                raise RuntimeError(
                    f"DefaultCPUAllocator: can't allocate memory: you tried to allocate {batch[0].shape[0]}"
                )
            return super().training_step(batch, batch_idx)

    return Limited(batch_size=16)


@pytest.mark.parametrize(("mode", "found"), [("power", 32), ("binsearch", 38)])
def test_scale_batch_size_finds_the_largest_size_under_a_memory_limit(tmp_path, mode, found):
    model = _limited(40)
    trainer = tricks.Trainer(max_epochs=1, default_root_dir=str(tmp_path), **QUICK)
    before = weights(model)
    size = tricks.Tuner(trainer).scale_batch_size(model, mode=mode)
    assert size == found and model.batch_size == found
    assert_same_weights(weights(model), before, atol=0.0)  # the trials' steps are undone
    assert os.listdir(tmp_path) == []


def reference(averaging: str, lr: float) -> dict[str, torch.Tensor]:
    """5 epochs of Adam at `lr` (32 steps each); EMA (decay 0.999) of every step from step 100, or SWA from
    epoch 3 (SWALR to 0.01 over 10 cosine epochs, the weights at the start of epochs 2..4 averaged)."""
    seed_all(1234)
    model = tricks.LitModel()
    net = model.model
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    data = DataLoader(tricks.digits(), batch_size=32, shuffle=True)
    avg = (
        AveragedModel(net, use_buffers=True, avg_fn=get_ema_avg_fn())
        if averaging == "ema"
        else AveragedModel(net)
    )
    sched, step = None, 0
    for epoch in range(5):
        if averaging == "swa" and epoch == 2:
            for g in opt.param_groups:
                g["initial_lr"] = 0.01
            sched = SWALR(opt, swa_lr=0.01, anneal_epochs=10, anneal_strategy="cos", last_epoch=5)
        if averaging == "swa" and epoch >= 2:
            avg.update_parameters(net)
        for x, y in data:
            opt.zero_grad()
            F.cross_entropy(net(x), y).backward()
            opt.step()
            if averaging == "ema" and step >= 100:
                avg.update_parameters(net)
            step += 1
        if sched is not None:
            sched.step()
    for p, a in zip(net.parameters(), avg.module.parameters()):
        p.detach().copy_(a)
    return weights(model)


@pytest.mark.parametrize("averaging", ["ema", "swa"])
def test_the_pages_weight_averaging_equals_swa_utils_by_hand(tmp_path, averaging):
    out = tricks.main(averaging=averaging, tune=False, default_root_dir=str(tmp_path), **QUICK)
    assert_same_weights(weights(out["model"]), reference(averaging, 1e-3))
