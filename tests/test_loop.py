"""The training loop against references: a hand-written torch loop and one big batch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import FAST, loop_state
from helpers.regression import Regressor, assert_same_weights, dataset, make_net, make_optim
from torch.utils.data import DataLoader, TensorDataset

from trainer import Trainer


def hand_loop(
    epochs: int, scheduler: str | None, frequency: int = 1, dropout: float = 0.3, batch_size: int = 4
):
    """What a user writes without a trainer."""
    torch.manual_seed(0)
    model = make_net(dropout)
    loader = DataLoader(dataset(), batch_size=batch_size, shuffle=True)
    opt, sched = make_optim(model.parameters(), scheduler)
    losses, steps = [], 0
    model.train()
    for epoch in range(epochs):
        for x, y in loader:
            loss = F.mse_loss(model(x), y)
            losses.append(loss.item())
            opt.zero_grad()
            loss.backward()
            opt.step()
            steps += 1
            if scheduler == "step" and steps % frequency == 0:
                sched.step()
        if scheduler == "epoch" and (epoch + 1) % frequency == 0:
            sched.step()
    return losses, model, opt


def fit_tandem(
    tmp_path, epochs: int, scheduler: str | None, frequency: int = 1, **kwargs
) -> tuple[Regressor, Trainer]:
    torch.manual_seed(0)
    task = Regressor(scheduler=scheduler, frequency=frequency)
    loader = DataLoader(dataset(), batch_size=4, shuffle=True)
    trainer = Trainer(max_epochs=epochs, default_root_dir=str(tmp_path), **{**FAST, **kwargs})
    trainer.fit(task, loader)
    return task, trainer


@pytest.mark.parametrize(
    ("scheduler", "frequency"), [(None, 1), ("epoch", 1), ("epoch", 2), ("step", 1), ("step", 3)]
)
def test_parity_with_hand_written_loop(tmp_path, scheduler, frequency):
    ref_losses, ref_model, ref_opt = hand_loop(3, scheduler, frequency)
    task, trainer = fit_tandem(tmp_path, 3, scheduler, frequency)
    assert len(task.losses) == len(ref_losses) == 15
    assert task.losses == pytest.approx(ref_losses, abs=1e-6)
    assert_same_weights(task.net, ref_model)
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(ref_opt.param_groups[0]["lr"])
    assert trainer.global_step == 15 and trainer.current_epoch == 3


def test_parity_detects_a_different_seed(tmp_path):
    """The reference is sensitive: another shuffle/dropout draw changes the losses."""
    ref_losses, _, _ = hand_loop(1, None)
    torch.manual_seed(1)
    task = Regressor()
    Trainer(max_epochs=1, default_root_dir=str(tmp_path), **FAST).fit(
        task, DataLoader(dataset(), 4, shuffle=True)
    )
    assert task.losses != pytest.approx(ref_losses, abs=1e-6)


def test_loss_logged_with_self_log_matches_hand_loop(tmp_path):
    steps: list[float] = []

    class Logged(Regressor):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            self.log("train/loss", loss)
            return loss

        def on_train_batch_end(self, outputs, batch, batch_idx):
            steps.append(float(self.trainer.callback_metrics["train/loss"]))

    ref_losses, _, _ = hand_loop(2, None)
    torch.manual_seed(0)
    task = Logged()
    Trainer(max_epochs=2, default_root_dir=str(tmp_path), **FAST).fit(
        task, DataLoader(dataset(), 4, shuffle=True)
    )
    assert steps == pytest.approx(ref_losses, abs=1e-6)


# ----- gradient accumulation ---------------------------------------------------------------------


def _accumulated(
    tmp_path, batch_size: int, k: int, epochs: int = 1, n: int = 20, **kw
) -> tuple[Regressor, Trainer]:
    torch.manual_seed(0)
    task = Regressor(dropout=0.0)
    data = TensorDataset(*(t[:n] for t in dataset().tensors))
    loader = DataLoader(data, batch_size=batch_size, shuffle=False)
    trainer = Trainer(
        max_epochs=epochs, accumulate_grad_batches=k, default_root_dir=str(tmp_path), **{**FAST, **kw}
    )
    trainer.fit(task, loader)
    return task, trainer


@pytest.mark.parametrize(("b", "k"), [(4, 2), (2, 4), (1, 8)])
def test_accumulation_equals_one_big_batch(tmp_path, b, k):
    """k micro-batches of b give the gradients and weights of one batch of k*b (16 samples: no partial window)."""
    small, t_small = _accumulated(tmp_path, b, k, epochs=2, n=16)
    big, t_big = _accumulated(tmp_path, b * k, 1, epochs=2, n=16)
    assert t_small.global_step == t_big.global_step == 4
    assert len(small.grads) == len(big.grads) == 4
    for gs, gb in zip(small.grads, big.grads):
        for a, c in zip(gs, gb):
            torch.testing.assert_close(a, c, rtol=1e-6, atol=1e-6)
    assert_same_weights(small.net, big.net, exact=False)


def test_accumulation_partial_window_at_epoch_end_steps(tmp_path):
    """20 samples, micro-batches of 4, k=2: windows of 8, 8, 4 == big batches of 8, 8, 4 (the last one smaller)."""
    small, t_small = _accumulated(tmp_path, 4, 2, epochs=2)
    big, t_big = _accumulated(tmp_path, 8, 1, epochs=2)
    assert t_small.global_step == t_big.global_step == 6
    for gs, gb in zip(small.grads, big.grads):
        for a, c in zip(gs, gb):
            torch.testing.assert_close(a, c, rtol=1e-6, atol=1e-6)
    assert_same_weights(small.net, big.net, exact=False)


def test_accumulation_partial_window_with_limit_train_batches(tmp_path):
    small, t_small = _accumulated(tmp_path, 4, 2, limit_train_batches=3)
    big, t_big = _accumulated(tmp_path, 8, 1, n=12)
    assert t_small.global_step == t_big.global_step == 2
    assert_same_weights(small.net, big.net, exact=False)


def test_accumulation_grads_are_not_stepped_mid_window(tmp_path):
    seen: list[tuple[int, int]] = []

    class Spy(Regressor):
        def on_after_backward(self):
            seen.append((loop_state(self.trainer).batch_in_epoch, self.trainer.global_step))

    torch.manual_seed(0)
    task = Spy(dropout=0.0)
    trainer = Trainer(max_epochs=1, accumulate_grad_batches=3, default_root_dir=str(tmp_path), **FAST)
    trainer.fit(task, DataLoader(dataset(), batch_size=4))
    # 5 batches, k=3: steps after batches 3 and 5
    assert [s for _, s in seen] == [0, 0, 0, 1, 1]
    assert trainer.global_step == 2


def test_returning_none_skips_the_batch_like_a_hand_loop(tmp_path):
    """Lightning's rule: None from training_step means no backward and no parameter update for that batch
    (the step still counts, so step-interval schedules and max_steps advance)."""

    class Skips(Regressor):
        def training_step(self, batch, batch_idx):
            return None if batch_idx % 3 == 1 else super().training_step(batch, batch_idx)

    torch.manual_seed(0)
    model = make_net(0.0)
    opt, _ = make_optim(model.parameters(), None)
    for i, (x, y) in enumerate(DataLoader(dataset(), batch_size=4)):
        if i % 3 == 1:
            continue
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
    torch.manual_seed(0)
    task = Skips(dropout=0.0)
    trainer = Trainer(max_epochs=1, default_root_dir=str(tmp_path), **FAST)
    trainer.fit(task, DataLoader(dataset(), batch_size=4))
    assert_same_weights(task.net, model)
    assert trainer.global_step == len(DataLoader(dataset(), batch_size=4))
