"""The training loop against references: a hand-written torch loop and one big batch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import FAST
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainer import Task, Trainer


def dataset(n: int = 20) -> TensorDataset:
    g = torch.Generator().manual_seed(1234)
    return TensorDataset(torch.randn(n, 4, generator=g), torch.randn(n, 1, generator=g))


def make_net(dropout: float = 0.3) -> nn.Module:
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Dropout(dropout), nn.Linear(8, 1))


def make_optim(params, scheduler: str | None):
    opt = torch.optim.SGD(params, lr=0.1, momentum=0.9)
    if scheduler == "epoch":
        return opt, torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    if scheduler == "step":
        return opt, torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.8)
    return opt, None


class Regressor(Task):
    def __init__(self, dropout: float = 0.3, scheduler: str | None = None, frequency: int = 1) -> None:
        super().__init__()
        self.net = make_net(dropout)
        self.scheduler, self.frequency = scheduler, frequency
        self.losses: list[float] = []
        self.grads: list[list[torch.Tensor]] = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self.net(x), y)
        self.losses.append(loss.item())
        return loss

    def on_before_optimizer_step(self, optimizer):
        self.grads.append([p.grad.clone() for p in self.net.parameters()])

    def configure_optimizers(self):
        opt, sched = make_optim(self.parameters(), self.scheduler)
        if sched is None:
            return opt
        interval = "step" if self.scheduler == "step" else "epoch"
        return {
            "optimizer": opt,
            "lr_scheduler": {"scheduler": sched, "interval": interval, "frequency": self.frequency},
        }


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


def assert_same_weights(a: nn.Module, b: nn.Module, exact: bool = True) -> None:
    for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert ka == kb
        if exact:
            assert torch.equal(va, vb), ka
        else:
            torch.testing.assert_close(va, vb, rtol=1e-6, atol=1e-6)


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
            seen.append((self.trainer.batch_in_epoch, self.trainer.global_step))

    torch.manual_seed(0)
    task = Spy(dropout=0.0)
    trainer = Trainer(max_epochs=1, accumulate_grad_batches=3, default_root_dir=str(tmp_path), **FAST)
    trainer.fit(task, DataLoader(dataset(), batch_size=4))
    # 5 batches, k=3: steps after batches 3 and 5
    assert [s for _, s in seen] == [0, 0, 0, 1, 1]
    assert trainer.global_step == 2


# ----- limits, stopping, validation schedule ----------------------------------------------------


class Counting(Regressor):
    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.val_calls: list[tuple[int, int]] = []  # (epoch, global step) of each validation run
        self.batches: list[tuple[int, int]] = []

    def training_step(self, batch, batch_idx):
        self.batches.append((self.current_epoch, batch_idx))
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val/loss", F.mse_loss(self.net(x), y))

    def on_validation_epoch_end(self):
        if not self.trainer.sanity_checking:
            self.val_calls.append((self.current_epoch, self.global_step))


def _fit_counting(tmp_path, val: bool = True, **kw) -> tuple[Counting, Trainer]:
    torch.manual_seed(0)
    task = Counting()
    trainer = Trainer(default_root_dir=str(tmp_path), **{**FAST, **kw})
    val_loader = DataLoader(dataset(8), batch_size=4) if val else None
    trainer.fit(task, DataLoader(dataset(), batch_size=4), val_loader)
    return task, trainer


@pytest.mark.parametrize(("limit", "expected"), [(2, 2), (0.6, 3), (1.0, 5), (10, 5), (0.0, 0)])
def test_limit_train_batches(tmp_path, limit, expected):
    task, trainer = _fit_counting(tmp_path, val=False, max_epochs=2, limit_train_batches=limit)
    assert task.batches == [(e, i) for e in range(2) for i in range(expected)]
    assert trainer.global_step == 2 * expected


def test_limit_train_batches_does_not_read_past_the_limit(tmp_path):
    reads: list[int] = []

    class Spy(TensorDataset):
        def __getitem__(self, i):
            reads.append(i)
            return super().__getitem__(i)

    ds = dataset()
    torch.manual_seed(0)
    Trainer(max_epochs=1, limit_train_batches=2, default_root_dir=str(tmp_path), **FAST).fit(
        Regressor(), DataLoader(Spy(*ds.tensors), batch_size=4)
    )
    assert reads == list(range(8))


def test_max_steps_stops_mid_epoch(tmp_path):
    task, trainer = _fit_counting(tmp_path, val=False, max_steps=7)
    assert trainer.global_step == 7
    assert task.batches == [(0, i) for i in range(5)] + [(1, 0), (1, 1)]


def test_max_steps_with_accumulation_counts_optimizer_steps(tmp_path):
    task, trainer = _fit_counting(tmp_path, val=False, max_steps=4, accumulate_grad_batches=2)
    assert trainer.global_step == 4
    assert len(task.batches) == 7  # windows 2, 2, 1 in epoch 0, then 2 in epoch 1


def test_max_steps_at_the_last_batch_finishes_the_epoch(tmp_path):
    """Stopping on an epoch's last batch still runs that epoch's end (validation, epoch hooks, scheduler)."""
    task, trainer = _fit_counting(tmp_path, max_steps=5)
    assert trainer.global_step == 5
    assert task.val_calls == [(0, 5)]
    assert trainer.current_epoch == 1


def test_max_epochs(tmp_path):
    task, trainer = _fit_counting(tmp_path, val=False, max_epochs=3)
    assert trainer.current_epoch == 3 and trainer.global_step == 15


@pytest.mark.parametrize(
    ("interval", "expected"), [(1.0, [5]), (0.5, [2, 4, 5]), (2, [2, 4, 5]), (0.2, [1, 2, 3, 4, 5])]
)
def test_val_check_interval(tmp_path, interval, expected):
    task, _ = _fit_counting(tmp_path, max_epochs=1, val_check_interval=interval)
    assert [s for _, s in task.val_calls] == expected


@pytest.mark.parametrize(("every", "expected"), [(1, [0, 1, 2, 3]), (2, [1, 3]), (3, [2])])
def test_check_val_every_n_epoch(tmp_path, every, expected):
    task, _ = _fit_counting(tmp_path, max_epochs=4, check_val_every_n_epoch=every)
    assert [e for e, _ in task.val_calls] == expected


def test_check_val_every_n_epoch_also_gates_mid_epoch_validation(tmp_path):
    task, _ = _fit_counting(tmp_path, max_epochs=2, check_val_every_n_epoch=2, val_check_interval=0.5)
    assert task.val_calls == [(1, 7), (1, 9), (1, 10)]


def test_num_sanity_val_steps(tmp_path):
    seen: list[tuple[bool, int]] = []

    class Spy(Counting):
        def validation_step(self, batch, batch_idx):
            seen.append((self.trainer.sanity_checking, batch_idx))

    torch.manual_seed(0)
    trainer = Trainer(max_epochs=1, default_root_dir=str(tmp_path), **{**FAST, "num_sanity_val_steps": 1})
    trainer.fit(Spy(), DataLoader(dataset(), batch_size=4), DataLoader(dataset(12), batch_size=4))
    assert seen == [(True, 0), (False, 0), (False, 1), (False, 2)]
    assert not trainer.sanity_checking


def test_fast_dev_run(tmp_path):
    task, trainer = _fit_counting(tmp_path, fast_dev_run=True, max_epochs=5)
    assert task.batches == [(0, 0)]
    assert trainer.global_step == 1
    assert task.val_calls == [(0, 1)]  # one validation batch at the end of the one epoch


def test_fast_dev_run_n(tmp_path):
    task, trainer = _fit_counting(tmp_path, fast_dev_run=3)
    assert task.batches == [(0, 0), (0, 1), (0, 2)]
    assert trainer.global_step == 3 and trainer.loggers == []


def test_on_train_batch_start_minus_one_skips_rest_of_epoch(tmp_path):
    class Skipper(Counting):
        def on_train_batch_start(self, batch, batch_idx):
            return -1 if batch_idx == 2 else None

    torch.manual_seed(0)
    task = Skipper()
    trainer = Trainer(max_epochs=2, default_root_dir=str(tmp_path), **FAST)
    trainer.fit(task, DataLoader(dataset(), batch_size=4))
    assert task.batches == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert trainer.global_step == 4 and trainer.current_epoch == 2


def test_on_train_batch_start_minus_one_drops_a_partial_window(tmp_path):
    class Skipper(Counting):
        def on_train_batch_start(self, batch, batch_idx):
            return -1 if batch_idx == 3 else None

        def on_train_epoch_start(self):
            self.grads_at_start = [*getattr(self, "grads_at_start", []), [p.grad for p in self.parameters()]]

    torch.manual_seed(0)
    task = Skipper(dropout=0.0)
    trainer = Trainer(max_epochs=2, accumulate_grad_batches=2, default_root_dir=str(tmp_path), **FAST)
    trainer.fit(task, DataLoader(dataset(), batch_size=4))
    assert trainer.global_step == 2  # windows [0, 1] per epoch; batch 2's window was cut by -1
    assert all(g is None for g in task.grads_at_start[1])


def test_should_stop_ends_training(tmp_path):
    class Stopper(Counting):
        def on_train_epoch_end(self):
            if self.current_epoch == 1:
                self.trainer.should_stop = True

    torch.manual_seed(0)
    task = Stopper()
    trainer = Trainer(max_epochs=5, default_root_dir=str(tmp_path), **FAST)
    trainer.fit(task, DataLoader(dataset(), batch_size=4))
    assert trainer.current_epoch == 2 and trainer.global_step == 10


def test_hook_order_for_one_batch(tmp_path):
    calls: list[str] = []
    names = [
        "on_fit_start", "on_train_start", "on_train_epoch_start", "on_train_batch_start", "on_before_backward",
        "on_after_backward", "on_before_optimizer_step", "on_before_zero_grad", "on_train_batch_end",
        "on_train_epoch_end", "on_train_end", "on_fit_end",
    ]  # fmt: skip

    class Recorder(Regressor):
        pass

    for name in names:
        setattr(Recorder, name, lambda self, *a, _n=name: calls.append(_n))
    torch.manual_seed(0)
    Trainer(max_epochs=1, limit_train_batches=1, default_root_dir=str(tmp_path), **FAST).fit(
        Recorder(), DataLoader(dataset(), batch_size=4)
    )
    assert calls == names


# ----- manual optimization -----------------------------------------------------------------------


class Manual(Task):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.net = make_net(0.0)
        self.losses: list[float] = []
        self.backward_hooks = 0

    def on_before_backward(self, loss):
        self.backward_hooks += 1

    def on_after_backward(self):
        self.backward_hooks += 1

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        x, y = batch
        loss = F.mse_loss(self.net(x), y)
        self.losses.append(loss.item())
        opt.zero_grad()
        self.manual_backward(loss)
        opt.step()
        if batch_idx == 4:  # last of 5 batches: the user steps the epoch scheduler
            self.lr_schedulers().step()

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)
        return [opt], [torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)]


def test_manual_optimization_matches_hand_loop(tmp_path):
    torch.manual_seed(0)
    model = make_net(0.0)
    loader = DataLoader(dataset(), batch_size=4, shuffle=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    ref = []
    for _ in range(2):
        for x, y in loader:
            loss = F.mse_loss(model(x), y)
            ref.append(loss.item())
            opt.zero_grad()
            loss.backward()
            opt.step()
        sched.step()

    torch.manual_seed(0)
    task = Manual()
    trainer = Trainer(max_epochs=2, default_root_dir=str(tmp_path), **FAST)
    trainer.fit(task, DataLoader(dataset(), batch_size=4, shuffle=True))
    assert task.losses == pytest.approx(ref, abs=1e-6)
    assert_same_weights(task.net, model)
    assert trainer.global_step == 10
    assert task.backward_hooks == 20  # manual_backward runs on_before_backward and on_after_backward
    # the task steps its own scheduler; the trainer must not step it again
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.1 * 0.5**2)


def test_manual_optimization_two_optimizers_and_max_steps(tmp_path):
    class Two(Task):
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False
            self.a, self.b = nn.Linear(4, 1), nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            for opt, net in zip(self.optimizers(), (self.a, self.b)):
                opt.zero_grad()
                self.manual_backward(F.mse_loss(net(x), y))
                opt.step()

        def configure_optimizers(self):
            return [
                torch.optim.SGD(self.a.parameters(), lr=0.1),
                torch.optim.SGD(self.b.parameters(), lr=0.1),
            ]

    torch.manual_seed(0)
    task = Two()
    a0, b0 = task.a.weight.clone(), task.b.weight.clone()
    trainer = Trainer(max_steps=6, default_root_dir=str(tmp_path), **FAST)
    trainer.fit(task, DataLoader(dataset(), batch_size=4))
    assert trainer.global_step == 6  # each opt.step() counts, as in Lightning
    assert not torch.equal(task.a.weight, a0) and not torch.equal(task.b.weight, b0)


def test_automatic_optimization_rejects_two_optimizers(tmp_path):
    from trainer.errors import TaskError

    class Two(Regressor):
        def configure_optimizers(self):
            return [torch.optim.SGD(self.parameters(), lr=0.1), torch.optim.Adam(self.parameters())]

    with pytest.raises(TaskError, match="automatic_optimization = False"):
        Trainer(max_epochs=1, default_root_dir=str(tmp_path), **FAST).fit(
            Two(), DataLoader(dataset(), batch_size=4)
        )
