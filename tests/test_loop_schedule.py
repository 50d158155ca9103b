"""The training loop's schedule: batch limits, max_steps/max_epochs, validation intervals, sanity steps,
fast_dev_run, stopping from hooks, and the hook order of one batch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import FAST
from helpers.regression import Regressor, dataset
from torch.utils.data import DataLoader, TensorDataset

from trainer import Trainer


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
    ("interval", "expected"), [(1.0, [5]), (0.5, [2, 4]), (2, [2, 4]), (0.2, [1, 2, 3, 4, 5])]
)  # as Lightning: every n batches, so the epoch's end validates only when its last batch is one of them
def test_val_check_interval(tmp_path, interval, expected):
    task, _ = _fit_counting(tmp_path, max_epochs=1, val_check_interval=interval)
    assert [s for _, s in task.val_calls] == expected


@pytest.mark.parametrize(("every", "expected"), [(1, [0, 1, 2, 3]), (2, [1, 3]), (3, [2])])
def test_check_val_every_n_epoch(tmp_path, every, expected):
    task, _ = _fit_counting(tmp_path, max_epochs=4, check_val_every_n_epoch=every)
    assert [e for e, _ in task.val_calls] == expected


def test_check_val_every_n_epoch_also_gates_mid_epoch_validation(tmp_path):
    task, _ = _fit_counting(tmp_path, max_epochs=2, check_val_every_n_epoch=2, val_check_interval=0.5)
    assert task.val_calls == [(1, 7), (1, 9)]  # Lightning's (tests/test_lightning_parity_flags.py)


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
        "on_fit_start", "on_train_start", "on_train_epoch_start", "on_train_batch_start", "on_before_zero_grad",
        "on_before_backward", "on_after_backward", "on_before_optimizer_step", "on_train_batch_end",
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
    assert calls == names  # Lightning's order: gradients are zeroed as a window starts, before its backward
