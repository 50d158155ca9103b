"""WeightAveraging and EMAWeightAveraging against a hand loop on torch.optim.swa_utils.AveragedModel:
updated after optimizer steps (not inside accumulation windows), validation on the averaged weights, the
average in the checkpoint's state_dict, and a resume that continues both models exactly."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from averaging_tasks import Regress, as_plain, assert_equal, fit, loader, params, state
from torch.optim.swa_utils import AveragedModel, get_ema_avg_fn

from callbacks import Callback, EMAWeightAveraging, ModelCheckpoint, WeightAveraging
from trainer import Task

EPOCHS, DECAY = 3, 0.9


def hand_loop(k: int = 1, start: int | None = None, every: int = 1) -> dict[str, torch.Tensor]:
    """EMA of parameters and buffers after the optimizer steps from `start` on, every `every`; the average
    copied into the model at the end."""
    torch.manual_seed(0)
    model = as_plain(Regress(batch_norm=True))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ema = AveragedModel(model, use_buffers=True, avg_fn=get_ema_avg_fn(DECAY))
    step = 0
    for _ in range(EPOCHS):
        for i, (x, y) in enumerate(loader()):
            if i % k == 0:
                opt.zero_grad()
            (F.mse_loss(model(x), y) / k).backward()
            if (i + 1) % k == 0:
                opt.step()
                if (start is None or step >= start) and step % every == 0:
                    ema.update_parameters(model)
                step += 1
    for avg, cur in zip(
        [*ema.module.parameters(), *ema.module.buffers()], [*model.parameters(), *model.buffers()]
    ):
        cur.detach().copy_(avg)
    return state(model)


@pytest.mark.parametrize(("k", "start", "every"), [(1, None, 1), (2, 3, 2)])
def test_ema_equals_a_hand_loop_on_averaged_model(k, start, every):
    expected = hand_loop(k, start, every)
    torch.manual_seed(0)
    task = Regress(batch_norm=True)
    ema = EMAWeightAveraging(decay=DECAY, update_starting_at_step=start, update_every_n_steps=every)
    fit(task, [ema], EPOCHS, accumulate_grad_batches=k)
    assert_equal(state(as_plain(task)), expected)


class ValWeights(Callback):
    def __init__(self, avg: WeightAveraging) -> None:
        self.avg, self.seen = avg, []

    def on_validation_batch_start(self, trainer, task, batch, batch_idx, dataloader_idx=0):
        self.seen.append((params(task), params(self.avg._average_model.module)))


class Validated(Regress):
    def validation_step(self, batch, batch_idx):
        self.log("val", F.mse_loss(self(batch[0]), batch[1]))


def test_validation_runs_on_the_averaged_weights_and_training_continues_on_its_own():
    torch.manual_seed(0)
    task = Validated()
    avg = WeightAveraging()  # the equal average (SWA) of every step
    probe = ValWeights(avg)
    trainer = Trainer_fit(task, [avg, probe])
    for current, averaged in probe.seen[1:]:  # (the sanity check: both still the initial weights)
        assert not all(torch.equal(a, b) for a, b in zip(current, averaged))
    assert int(avg._average_model.n_averaged) == trainer.global_step


def Trainer_fit(task: Task, callbacks: list):
    from conftest import FAST

    from trainer import Trainer

    trainer = Trainer(max_epochs=2, callbacks=callbacks, **{**FAST, "num_sanity_val_steps": 1})
    trainer.fit(task, loader(), loader(shuffle=False))
    return trainer


def test_checkpoint_holds_the_average_in_state_dict_and_resume_continues_both(tmp_path):
    torch.manual_seed(0)
    whole_task = Regress(batch_norm=True)
    whole_ema = EMAWeightAveraging(decay=DECAY)
    whole = fit(whole_task, [whole_ema], EPOCHS)

    torch.manual_seed(0)
    task = Regress(batch_norm=True)
    ema = EMAWeightAveraging(decay=DECAY)
    ckpt = ModelCheckpoint(dirpath=str(tmp_path), every_n_train_steps=5, save_top_k=-1)
    fit(task, [ema, ckpt], EPOCHS, enable_checkpointing=True, max_steps=13)
    path = tmp_path / "epoch=1-step=10.ckpt"
    saved = torch.load(path, weights_only=True)
    assert saved["global_step"] == 10 and set(saved) >= {"current_model_state", "averaging_state"}
    # load_from_checkpoint gives the averaged model
    assert_equal(Regress.load_from_checkpoint(str(path), batch_norm=True).state_dict(), saved["state_dict"])
    assert not torch.equal(saved["state_dict"]["head.weight"], saved["current_model_state"]["head.weight"])

    torch.manual_seed(5)
    resumed_task = Regress(batch_norm=True)
    resumed_ema = EMAWeightAveraging(decay=DECAY)
    resumed = fit(resumed_task, [resumed_ema], EPOCHS, ckpt_path=str(path))
    assert resumed.global_step == whole.global_step == EPOCHS * 8
    assert_equal(state(resumed_task), state(whole_task))
    assert_equal(resumed_ema._average_model.state_dict(), whole_ema._average_model.state_dict())


def test_custom_should_update_as_in_lightnings_docs():
    class LateEMA(WeightAveraging):  # Lightning's documentation example
        def __init__(self):
            super().__init__(avg_fn=get_ema_avg_fn())

        def should_update(self, step_idx=None, epoch_idx=None):
            return (step_idx is not None) and (step_idx >= 10)

    torch.manual_seed(0)
    cb = LateEMA()
    fit(Regress(), [cb], 2)
    assert int(cb._average_model.n_averaged) == 16 - 10
