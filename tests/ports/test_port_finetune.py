"""finetune.py (configure_callbacks, configure_gradient_clipping + clip_gradients, lr_scheduler_step with a
non-torch scheduler, optimizer_zero_grad, accumulate_grad_batches, ModelCheckpoint "{epoch:02d}-{val_loss:.2f}",
EarlyStopping) against a hand loop, and the order in which Lightning calls the optimization hooks."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from tests.ports.harness import QUIET, LazyPort, assert_same_weights, seed_all, weights

finetune = LazyPort("finetune")

K, CLIP = 2, 0.2


def reference() -> dict[str, object]:
    """accumulate_grad_batches=2: each loss is divided by 2, the optimizer's gradients are zeroed (with the
    task's optimizer_zero_grad) before the first backward of a window, and the step runs after the second
    backward, after configure_gradient_clipping. The epoch scheduler steps at the epoch's end through
    lr_scheduler_step(scheduler, None); early stopping (patience 2) checks val_loss after validation."""
    seed_all(3)
    net = finetune.FineTuner()  # as a plain nn.Module: layers and forward only
    opt = torch.optim.SGD(
        [{"params": net.backbone.parameters(), "lr": 0.05}, {"params": net.head.parameters()}],
        lr=0.5,
        momentum=0.9,
    )
    sched = finetune.EpochDecay(opt)
    train = DataLoader(finetune.digits(0, 1024), batch_size=64, shuffle=True)
    val = DataLoader(finetune.digits(1024, 1536), batch_size=128)
    best, wait, best_epoch, epochs, clipped = float("inf"), 0, -1, 0, 0
    for epoch in range(6):
        for p in net.backbone.parameters():
            p.requires_grad = epoch >= 1
        for i, (x, y) in enumerate(train):
            loss = F.cross_entropy(net(x), y) / K
            if i % K == 0:
                opt.zero_grad(set_to_none=False)
            loss.backward()
            if (i + 1) % K == 0:
                if epoch >= 1:
                    clipped += float(torch.nn.utils.clip_grad_norm_(list(net.parameters()), CLIP)) > CLIP
                opt.step()
        sched.step(epoch=epoch)
        with torch.no_grad():  # self.log's epoch value: batch values averaged, weighted by batch size
            val_loss = sum(float(F.cross_entropy(net(x), y)) * len(y) for x, y in val) / 512
        epochs += 1
        if val_loss < best:
            best, wait, best_epoch = val_loss, 0, epoch
        else:
            wait += 1
            if wait >= 2:
                break
    return {"weights": weights(net), "best": best, "best_epoch": best_epoch, "epochs": epochs,
            "lrs": [g["lr"] for g in opt.param_groups], "clipped": clipped}  # fmt: skip


@pytest.fixture(scope="module")
def ref():
    return reference()


def test_finetune_ends_with_the_hand_loops_weights(tmp_path, ref):
    out = finetune.main(default_root_dir=str(tmp_path), **QUIET)
    trainer = out["trainer"]
    assert_same_weights(weights(out["model"]), ref["weights"])
    assert trainer.current_epoch == ref["epochs"]
    assert ref["clipped"] > 0  # the clipping hook changes this run's result
    assert [g["lr"] for g in trainer.optimizers[0].param_groups] == pytest.approx(ref["lrs"])
    # configure_callbacks: its ModelCheckpoint replaced the Trainer's default one, its EarlyStopping was added
    assert len(trainer.checkpoint_callbacks) == 1 and trainer.checkpoint_callback.monitor == "val_loss"
    assert [cb.patience for cb in trainer.callbacks if isinstance(cb, finetune.EarlyStopping)] == [2]
    name = os.path.basename(trainer.checkpoint_callback.best_model_path)
    assert name == f"epoch={ref['best_epoch']:02d}-val_loss={ref['best']:.2f}.ckpt"


class Recording:
    """Mixed into the script's task (at test time): records when the trainer calls its hooks."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple] = []

    def training_step(self, batch, batch_idx):
        self.events.append(("training_step", self.current_epoch, batch_idx))
        return super().training_step(batch, batch_idx)

    def optimizer_zero_grad(self, epoch, batch_idx, optimizer):
        self.events.append(("optimizer_zero_grad", epoch, batch_idx))
        super().optimizer_zero_grad(epoch, batch_idx, optimizer)

    def on_after_backward(self):
        self.events.append(("backward",))

    def on_before_optimizer_step(self, optimizer):
        self.events.append(("on_before_optimizer_step",))

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
        # Lightning passes the Trainer's gradient_clip_algorithm as given (None unless set, and clip_gradients
        # then uses "norm"); Tandem's Trainer default is "norm" itself
        self.events.append(
            ("configure_gradient_clipping", gradient_clip_val, gradient_clip_algorithm or "norm")
        )
        super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)

    def lr_scheduler_step(self, scheduler, metric):
        self.events.append(("lr_scheduler_step", self.current_epoch, metric))
        super().lr_scheduler_step(scheduler, metric)


def test_optimization_hooks_run_in_lightnings_order(tmp_path):
    seed_all(3)
    task = type("RecordingFineTuner", (Recording, finetune.FineTuner), {})()
    train = DataLoader(finetune.digits(0, 256), batch_size=64, shuffle=True)
    val = DataLoader(finetune.digits(1024, 1088), batch_size=64)  # its callbacks monitor val_loss
    finetune.Trainer(
        max_epochs=2, accumulate_grad_batches=K, gradient_clip_val=CLIP, logger=False,
        default_root_dir=str(tmp_path), **QUIET,
    ).fit(task, train, val)  # fmt: skip
    expected: list[tuple] = []
    for epoch in range(2):
        for i in range(0, 4, 2):  # per window: step, zero_grad, backward; step, backward, hook, clipping
            expected += [("training_step", epoch, i), ("optimizer_zero_grad", epoch, i), ("backward",),
                         ("training_step", epoch, i + 1), ("backward",), ("on_before_optimizer_step",),
                         ("configure_gradient_clipping", CLIP, "norm")]  # fmt: skip
        expected.append(("lr_scheduler_step", epoch, None))
    assert task.events == expected
