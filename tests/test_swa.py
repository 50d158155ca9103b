"""StochasticWeightAveraging against a hand loop on torch.optim.swa_utils, with Lightning's schedule: SWALR
from epoch swa_epoch_start (1-based), the weights at the start of each SWA epoch averaged, the average
transferred when the last epoch ends, batch-norm statistics recomputed by update_bn; and resume."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from averaging_tasks import Regress, as_plain, assert_equal, fit, loader, params, state
from torch.optim.swa_utils import SWALR, AveragedModel, update_bn

from callbacks import LambdaCallback, ModelCheckpoint, StochasticWeightAveraging
from tandem_core.errors import ConfigError

EPOCHS, START, SWA_LR, ANNEAL = 5, 3, 0.02, 2


def hand_loop(batch_norm: bool) -> tuple[dict[str, torch.Tensor], list[float]]:
    """Lightning's semantics written with swa_utils: SWALR(last_epoch=max_epochs for 'cos') built at the start
    of epoch START-1 (0-based), AveragedModel updated at the start of epochs START-1..EPOCHS-1, average into
    the model at the end, then update_bn over the training data."""
    torch.manual_seed(0)
    task = Regress(batch_norm)
    model, data = as_plain(task), loader()
    opt = torch.optim.SGD(model.parameters(), lr=task.lr, momentum=0.9)
    swa = AveragedModel(model)
    sched, lrs = None, []
    for epoch in range(EPOCHS):
        if epoch == START - 1:
            for g in opt.param_groups:
                g["initial_lr"] = SWA_LR
            sched = SWALR(opt, swa_lr=SWA_LR, anneal_epochs=ANNEAL, anneal_strategy="cos", last_epoch=EPOCHS)
        if epoch >= START - 1:
            swa.update_parameters(model)
        lrs.append(opt.param_groups[0]["lr"])
        for x, y in data:
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            opt.step()
        if sched is not None:
            sched.step()
    for p, avg in zip(model.parameters(), swa.module.parameters()):
        p.detach().copy_(avg)
    if batch_norm:
        update_bn(((x,) for x, _ in loader()), model)
    return state(model), lrs


def _run(batch_norm: bool, **kwargs):
    torch.manual_seed(0)
    task = Regress(batch_norm)
    lrs = []
    record = LambdaCallback(
        on_train_epoch_start=lambda t, m: lrs.append(t.optimizers[0].param_groups[0]["lr"])
    )
    swa = StochasticWeightAveraging(swa_lrs=SWA_LR, swa_epoch_start=START, annealing_epochs=ANNEAL, **kwargs)
    trainer = fit(task, [swa, record], EPOCHS)
    return task, trainer, lrs


@pytest.mark.parametrize("batch_norm", [False, True])
def test_swa_equals_a_hand_loop_on_swa_utils(batch_norm):
    expected, expected_lrs = hand_loop(batch_norm)
    task, trainer, lrs = _run(batch_norm)
    got = state(as_plain(task))
    assert_equal(got, expected, atol=0 if not batch_norm else 1e-6)  # update_bn: another batch order
    assert lrs == expected_lrs  # each epoch's rate, read after SWA's epoch start (callback order)
    assert trainer.current_epoch == EPOCHS and trainer.global_step == EPOCHS * 8  # no extra epoch or step


def test_swa_leaves_the_weights_alone_when_training_stops_early():
    torch.manual_seed(0)
    task = Regress()
    swa = StochasticWeightAveraging(swa_lrs=SWA_LR, swa_epoch_start=2)
    fit(task, [swa], EPOCHS, max_steps=8 * 3)  # stops after 3 of 5 epochs
    assert swa.n_averaged is not None and int(swa.n_averaged) == 2
    assert not all(torch.equal(a, b) for a, b in zip(params(task), params(swa._average_model)))


@pytest.mark.parametrize("stop", ["mid_epoch", "epoch_end"])
def test_resume_mid_swa_is_bit_identical(tmp_path, stop):
    """A run stopped inside the SWA phase and resumed ends at the same step with the same weights and
    average as the uninterrupted run (SWALR's state, the average and its count come back)."""
    _, whole, _ = _run(True)
    torch.manual_seed(0)
    first = Regress(True)
    every = dict(every_n_train_steps=3) if stop == "mid_epoch" else dict(every_n_epochs=1)
    ckpt = ModelCheckpoint(dirpath=str(tmp_path), save_top_k=-1, **every)
    swa = StochasticWeightAveraging(swa_lrs=SWA_LR, swa_epoch_start=START, annealing_epochs=ANNEAL)
    fit(
        first,
        [swa, ckpt],
        EPOCHS,
        enable_checkpointing=True,
        max_steps=8 * 3 + (3 if stop == "mid_epoch" else 0),
    )
    path = sorted(tmp_path.glob("*.ckpt"), key=lambda p: p.stat().st_mtime)[-1]
    saved = torch.load(path, weights_only=True)
    assert saved["global_step"] == (27 if stop == "mid_epoch" else 24)
    torch.manual_seed(123)  # a different seed: everything must come from the checkpoint
    resumed_task = Regress(True)
    swa2 = StochasticWeightAveraging(swa_lrs=SWA_LR, swa_epoch_start=START, annealing_epochs=ANNEAL)
    resumed = fit(resumed_task, [swa2], EPOCHS, ckpt_path=str(path))
    assert resumed.global_step == whole.global_step == EPOCHS * 8
    assert_equal(state(resumed_task), state(whole.task))
    assert_equal(params(swa2._average_model), params(whole.callbacks[0]._average_model))
    assert int(swa2.n_averaged) == int(whole.callbacks[0].n_averaged)


def test_arguments_are_checked_as_lightning_does():
    for bad in (dict(swa_lrs=-1.0), dict(swa_lrs=[0.1, -0.1]), dict(swa_lrs=0.1, swa_epoch_start=0)):
        with pytest.raises(ConfigError):
            StochasticWeightAveraging(**bad)
    with pytest.raises(ConfigError, match="annealing_strategy"):
        StochasticWeightAveraging(swa_lrs=0.1, annealing_strategy="step")
