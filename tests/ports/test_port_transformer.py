"""transformer.py (optimizer_step override with a warm-up, epoch scheduler, gradient clipping) against a
hand-written loop. Lightning calls the task's optimizer_step(epoch, batch_idx, optimizer, closure) for every
optimizer step; the closure runs training_step, zero_grad and backward, and the optimizer's step calls it
before clipping (on_before_optimizer_step, then gradient clipping, then the update)."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from callbacks import Callback
from tests.ports.harness import QUIET, LazyPort, assert_same_weights, differs, nonempty, seed_all, weights

transformer = LazyPort("transformer")

LR, WARMUP, EPOCHS = 5e-3, 6, 3


class StepLRs(Callback):
    """The learning rate each optimizer step used (read where Lightning calls on_before_optimizer_step)."""

    def __init__(self) -> None:
        self.lrs: list[float] = []

    def on_before_optimizer_step(self, trainer, task, optimizer):
        self.lrs.append(optimizer.param_groups[0]["lr"])


@functools.cache  # computed once per session; the tests only read it
def reference(warmup: bool = True) -> tuple[dict[str, torch.Tensor], list[float]]:
    seed_all(42)
    train = DataLoader(
        transformer.ReverseDataset(8, 6, 256, seed=0), batch_size=64, shuffle=True, drop_last=True
    )
    val = DataLoader(transformer.ReverseDataset(8, 6, 64, seed=1), batch_size=64)
    net = transformer.ReversePredictor()  # used as a plain nn.Module: its layers and forward only
    opt = torch.optim.Adam(net.parameters(), lr=LR)
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.8)
    step, lrs = 0, []
    for _ in range(EPOCHS):
        net.train()
        for x, y in train:
            if warmup and step < WARMUP:  # what the overridden optimizer_step does before stepping
                for pg in opt.param_groups:
                    pg["lr"] = (step + 1) / WARMUP * LR
            out = net(x)
            loss = F.cross_entropy(out.view(-1, out.size(-1)), y.view(-1))
            opt.zero_grad()
            loss.backward()
            lrs.append(opt.param_groups[0]["lr"])
            torch.nn.utils.clip_grad_norm_(net.parameters(), 5.0)
            opt.step()
            step += 1
        sched.step()  # interval "epoch": after the epoch's last batch
        net.eval()
        with torch.no_grad():  # validation at the epoch's end (its loader draws from the global RNG)
            for x, _ in val:
                net(x)
    return weights(net), lrs


def test_transformer_ends_with_the_hand_loops_weights(tmp_path):
    out = transformer.main(default_root_dir=str(tmp_path), **QUIET)
    expected, _ = reference()
    assert_same_weights(weights(out["model"]), expected)


def test_overridden_optimizer_step_sets_the_warmup_learning_rate_of_every_step(tmp_path):
    lrs = StepLRs()
    out = transformer.main(default_root_dir=str(tmp_path), callbacks=[lrs], **QUIET)
    _, expected = reference()
    assert nonempty(lrs.lrs) == expected
    assert lrs.lrs[0] == pytest.approx(LR / WARMUP) and lrs.lrs[WARMUP] == LR  # the warm-up really ramps
    assert out["trainer"].global_step == EPOCHS * 4


def test_warmup_matters_for_this_script():
    assert differs(reference(warmup=True)[0], reference(warmup=False)[0])
