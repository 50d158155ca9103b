"""GradientAccumulationScheduler equals changing accumulate_grad_batches by hand at those epochs (a hand loop),
and a run stopped inside an accumulation window of a scheduled epoch resumes bit for bit."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from averaging_tasks import Regress, as_plain, assert_equal, fit, loader, state

from callbacks import GradientAccumulationScheduler, LambdaCallback
from tandem_core.errors import ConfigError

SCHEDULE, EPOCHS = {1: 2, 3: 4}, 4  # epoch 0 accumulates 1 (added, as Lightning does)


def hand_loop() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = as_plain(Regress())
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for k in [1, 2, 2, 4]:  # the factor of each epoch
        for i, (x, y) in enumerate(loader()):
            if i % k == 0:
                opt.zero_grad()
            (F.mse_loss(model(x), y) / k).backward()
            if (i + 1) % k == 0:
                opt.step()
    return state(model)


def test_scheduler_equals_accumulation_changed_by_hand():
    expected = hand_loop()
    torch.manual_seed(0)
    task, seen = Regress(), []
    sched = GradientAccumulationScheduler(dict(SCHEDULE))
    probe = LambdaCallback(on_train_epoch_start=lambda t, m: seen.append(t.accumulate_grad_batches))
    trainer = fit(task, [sched, probe], EPOCHS)
    assert seen == [1, 2, 2, 4] and sched.scheduling == {0: 1, **SCHEDULE}
    assert trainer.global_step == 8 + 4 + 4 + 2
    assert_equal(state(as_plain(task)), expected)


def test_resume_inside_a_scheduled_window_is_bit_identical(tmp_path):
    torch.manual_seed(0)
    whole_task = Regress()
    whole = fit(whole_task, [GradientAccumulationScheduler(dict(SCHEDULE))], EPOCHS)
    torch.manual_seed(0)
    stopper = LambdaCallback(on_train_batch_end=_stop_at(str(tmp_path), 3, 5))  # epoch 3 (k=4): mid-window
    with pytest.raises(RuntimeError, match="crash"):
        fit(Regress(), [GradientAccumulationScheduler(dict(SCHEDULE)), stopper], EPOCHS)
    saved = torch.load(tmp_path / "last.ckpt", weights_only=True)
    assert saved["loop"]["batch_in_epoch"] == 6 and saved["epoch"] == 3
    torch.manual_seed(3)
    task = Regress()
    resumed = fit(
        task, [GradientAccumulationScheduler(dict(SCHEDULE))], EPOCHS, ckpt_path=str(tmp_path / "last.ckpt")
    )
    assert resumed.global_step == whole.global_step
    assert_equal(state(task), state(whole_task))


def _stop_at(dirpath: str, epoch: int, batch: int):
    """Checkpoint after training batch `batch` of `epoch`, then crash."""

    def hook(trainer, task, outputs, b, batch_idx):
        if trainer.current_epoch == epoch and batch_idx == batch:
            trainer.save_checkpoint(dirpath + "/last.ckpt")
            raise RuntimeError("crash")

    return hook


def test_refusals_as_lightning():
    with pytest.raises(ConfigError):
        GradientAccumulationScheduler({})
    with pytest.raises(ConfigError):
        GradientAccumulationScheduler({0: 0})
    with pytest.raises(ConfigError, match="remove one"):
        fit(Regress(), [GradientAccumulationScheduler({1: 2})], 1, accumulate_grad_batches=2)
