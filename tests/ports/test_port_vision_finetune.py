"""vision_finetune.py (Lightning's computer_vision_fine_tuning.py): MilestonesFinetuning's freezing, unfreezing
into new Adam groups at the milestones and the MultiStepLR, against a hand loop with torch alone; and a resume
after the first unfreeze that continues bit for bit."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from callbacks import LambdaCallback, ModelCheckpoint
from tests.ports.harness import QUIET, LazyPort, assert_same_weights, seed_all, weights

port = LazyPort("vision_finetune")
RUN = dict(QUIET, logger=False, accelerator="cpu")


def reference() -> dict[str, object]:
    """Epoch 0-1: only the head trains (batch norm frozen: no running statistics, no training). At epoch 2 the
    last 5 layers join with lr = the first group's rate / 10, at epoch 4 the rest; MultiStepLR((2, 4), 0.1)
    steps at each epoch's end over every group."""
    seed_all(1234)
    model = port.TransferLearningModel()
    fx = model.feature_extractor
    port.BaseFinetuning.freeze(fx, train_bn=False)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=(2, 4), gamma=0.1)
    train = DataLoader(port.digit_images(0, 512), batch_size=32, shuffle=True)
    val = DataLoader(port.digit_images(1024, 1280), batch_size=32)
    rates = []
    for epoch in range(6):
        for part in [fx[-5:]] if epoch == 2 else [fx[:-5]] if epoch == 4 else []:
            layers = [m for m in part.modules() if not list(m.children()) or m._parameters]
            for m in layers:
                if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                    m.track_running_stats = True
                for p in m.parameters(recurse=False):
                    p.requires_grad = True
            # with train_bn=False the batch norms train again but join no group (so they keep their values)
            plain = [m for m in layers if not isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
            new = [p for m in plain for p in m.parameters(recurse=False)]
            opt.add_param_group({"params": new, "lr": opt.param_groups[0]["lr"] / 10.0})
        rates.append([g["lr"] for g in opt.param_groups])
        model.train()
        for x, y in train:
            opt.zero_grad()
            F.binary_cross_entropy_with_logits(model(x), y.view(-1, 1).float()).backward()
            opt.step()
        model.eval()
        with torch.no_grad():  # validation (its loader's iterator draws a seed from the global generator)
            for x, _ in val:
                model(x)
        sched.step()
    return {"weights": weights(model), "rates": rates}


def _rates(into: list) -> LambdaCallback:
    return LambdaCallback(
        on_train_epoch_start=lambda t, m: into.append([g["lr"] for g in t.optimizers[0].param_groups])
    )


def test_milestones_finetuning_equals_the_hand_loop(tmp_path):
    ref, rates = reference(), []
    out = port.main(default_root_dir=str(tmp_path), callbacks=[_rates(rates)], **RUN)
    assert [len(r) for r in rates] == [1, 1, 2, 2, 3, 3]
    assert rates == [pytest.approx(r, rel=1e-12) for r in ref["rates"]]
    assert_same_weights(weights(out["model"]), ref["weights"])


def test_resume_after_the_first_milestone_is_bit_identical(tmp_path):
    """Stopped inside epoch 3 (after the first unfreeze), resumed with another seed: same step, same weights."""
    whole = port.main(default_root_dir=str(tmp_path / "a"), **RUN)
    ckpt = ModelCheckpoint(dirpath=str(tmp_path / "ck"), every_n_train_steps=16 * 3 + 5, save_top_k=-1)
    port.main(default_root_dir=str(tmp_path / "b"), callbacks=[ckpt], max_steps=16 * 3 + 5, **RUN)
    seed_all(99)
    model = port.TransferLearningModel()
    trainer = port.Trainer(
        max_epochs=6, callbacks=[port.MilestonesFinetuning(milestones=(2, 4))], num_sanity_val_steps=0,
        default_root_dir=str(tmp_path / "c"), **RUN,
    )  # fmt: skip
    trainer.fit(model, datamodule=port.DigitsImageDataModule(batch_size=32), ckpt_path=ckpt.best_model_path)
    assert trainer.global_step == whole["trainer"].global_step == 16 * 6
    assert_same_weights(weights(model), weights(whole["model"]), atol=0.0)
