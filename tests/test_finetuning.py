"""BackboneFinetuning and BaseFinetuning: the backbone frozen before training, unfrozen at Lightning's epoch into
a new parameter group with Lightning's learning rates (against a hand loop), and a resume after the unfreeze
that rebuilds the groups and continues bit for bit."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from averaging_tasks import Regress, as_plain, assert_equal, fit, loader, state
from torch import nn

from callbacks import BackboneFinetuning, BaseFinetuning, LambdaCallback, ModelCheckpoint
from tandem_core.errors import ConfigError

EPOCHS, UNFREEZE = 4, 1


class Trainable(Regress):
    """Lightning's documented pattern: the optimizer gets only the parameters that train from the start."""

    def configure_optimizers(self):
        return torch.optim.SGD(filter(lambda p: p.requires_grad, self.parameters()), lr=self.lr, momentum=0.9)


def hand_loop() -> tuple[dict[str, torch.Tensor], list[list[float]]]:
    torch.manual_seed(0)
    task = Trainable()
    for p in task.backbone.parameters():
        p.requires_grad = False
    model = as_plain(task)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=task.lr, momentum=0.9)
    previous, rates = 0.0, []
    for epoch in range(EPOCHS):
        if epoch == UNFREEZE:  # the first group's rate times backbone_initial_ratio_lr (0.1), no denominator
            for p in task.backbone.parameters():
                p.requires_grad = True
            previous = opt.param_groups[0]["lr"] * 0.1
            opt.add_param_group({"params": list(task.backbone.parameters()), "lr": previous})
        elif epoch > UNFREEZE:  # times lambda_func(epoch + 1) = 2, at most the first group's rate
            previous = min(2.0 * previous, opt.param_groups[0]["lr"])
            opt.param_groups[-1]["lr"] = previous
        rates.append([g["lr"] for g in opt.param_groups])
        for x, y in loader():
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            opt.step()
    return state(model), rates


def _rates(into: list) -> LambdaCallback:
    return LambdaCallback(
        on_train_epoch_start=lambda t, m: into.append([g["lr"] for g in t.optimizers[0].param_groups])
    )


def test_backbone_unfreezes_at_lightnings_epoch_with_lightnings_groups_and_rates():
    expected, expected_rates = hand_loop()
    torch.manual_seed(0)
    task, rates = Trainable(), []
    finetune = BackboneFinetuning(unfreeze_backbone_at_epoch=UNFREEZE)
    frozen = LambdaCallback(
        on_fit_start=lambda t, m: rates.append(all(not p.requires_grad for p in m.backbone.parameters()))
    )
    trainer = fit(task, [finetune, _rates(rates), frozen], EPOCHS)
    assert rates.pop(0) is True  # frozen when fit starts
    assert rates == expected_rates
    assert rates == [pytest.approx(r) for r in ([0.05], [0.05, 0.005], [0.05, 0.01], [0.05, 0.02])]
    assert_equal(state(as_plain(task)), expected)
    groups = trainer.optimizers[0].param_groups
    assert [len(g["params"]) for g in groups] == [2, 2] and groups[1]["params"][0] is task.backbone[0].weight


@pytest.mark.parametrize("at", [8 * 2 + 3, 8 * 3])
def test_resume_after_the_unfreeze_is_bit_identical(tmp_path, at):
    torch.manual_seed(0)
    whole_task = Trainable()
    whole = fit(whole_task, [BackboneFinetuning(unfreeze_backbone_at_epoch=UNFREEZE)], EPOCHS)
    torch.manual_seed(0)
    every = dict(every_n_train_steps=at) if at % 8 else dict(every_n_epochs=1)
    ckpt = ModelCheckpoint(dirpath=str(tmp_path), save_top_k=-1, **every)
    fit(Trainable(), [BackboneFinetuning(unfreeze_backbone_at_epoch=UNFREEZE), ckpt], EPOCHS,
        enable_checkpointing=True, max_steps=at)  # fmt: skip
    path = max(tmp_path.glob("*.ckpt"), key=lambda p: p.stat().st_mtime)
    assert torch.load(path, weights_only=True)["global_step"] == at
    torch.manual_seed(9)
    task, rates = Trainable(), []
    resumed = fit(task, [BackboneFinetuning(unfreeze_backbone_at_epoch=UNFREEZE), _rates(rates)], EPOCHS,
                  ckpt_path=str(path))  # fmt: skip
    assert resumed.global_step == whole.global_step == EPOCHS * 8
    assert_equal(state(task), state(whole_task))
    assert rates[-1] == pytest.approx([0.05, 0.02])
    for g, h in zip(resumed.optimizers[0].param_groups, whole.optimizers[0].param_groups):
        assert g["lr"] == h["lr"] and len(g["params"]) == len(h["params"])


def test_base_finetuning_helpers_follow_lightning():
    model = nn.Sequential(nn.Linear(2, 3), nn.BatchNorm1d(3), nn.Sequential(nn.Linear(3, 1)))
    assert [type(m) for m in BaseFinetuning.flatten_modules(model)] == [nn.Linear, nn.BatchNorm1d, nn.Linear]
    BaseFinetuning.freeze(model, train_bn=True)
    assert [p.requires_grad for p in model.parameters()] == [False, False, True, True, False, False]
    BaseFinetuning.freeze(model, train_bn=False)
    assert not any(p.requires_grad for p in model.parameters()) and not model[1].track_running_stats
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.3)
    BaseFinetuning.unfreeze_and_add_param_group(model[0], opt)  # no lr: the first group's / initial_denom_lr
    assert opt.param_groups[1]["lr"] == pytest.approx(0.03) and model[0].weight.requires_grad
    with pytest.warns(UserWarning, match="already in a group"):
        BaseFinetuning.unfreeze_and_add_param_group(model[0], opt, lr=0.1)
    assert len(opt.param_groups) == 2


def test_backbone_finetuning_needs_a_backbone():
    class NoBackbone(Regress):
        def __init__(self):
            super().__init__()
            self.body = self.backbone
            del self.backbone

    with pytest.raises(ConfigError, match="backbone"):
        fit(NoBackbone(), [BackboneFinetuning()], 1)
