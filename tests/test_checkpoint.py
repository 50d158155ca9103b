"""Checkpoints: an interrupted and resumed run equals an uninterrupted one."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import FAST, loop_state
from helpers.checkpointing import CountingData, Net, assert_equal_weights, run_fit
from torch.utils.data import DataLoader, TensorDataset

from callbacks import Callback, ModelCheckpoint
from trainer import Task, Trainer, seed_everything


def _resume_case(tmp_path, stop: dict, resume: dict | None = None, val: bool = False, **common):
    """Run A uninterrupted; run B stops per `stop`, saves, and a new Trainer and Task continue it."""
    a, trainer_a, data_a = run_fit(tmp_path, val=val, **common)
    b1, trainer_b1, data_b1 = run_fit(tmp_path, val=val, **{**common, **stop})
    path = str(tmp_path / "b.ckpt")
    trainer_b1.save_checkpoint(path)
    b2, trainer_b2, data_b2 = run_fit(
        tmp_path, seed=123, ckpt_path=path, val=val, **{**common, **(resume or {})}
    )
    assert_equal_weights(a, b2)
    assert b1.losses + b2.losses == a.losses  # every step's loss, bit for bit
    assert trainer_b2.global_step == trainer_a.global_step
    assert trainer_b2.current_epoch == trainer_a.current_epoch
    lr_a = trainer_a.optimizers[0].param_groups[0]["lr"]
    assert trainer_b2.optimizers[0].param_groups[0]["lr"] == lr_a
    assert data_b1.reads + data_b2.reads == data_a.reads  # skipped batches are not read again
    return a, b1, b2, trainer_b1


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_resume_mid_epoch_is_bit_identical(tmp_path, optimizer):
    _, b1, b2, _ = _resume_case(tmp_path, {"max_steps": 7}, max_epochs=3, task_kw={"optimizer": optimizer})
    assert len(b1.losses) == 7 and len(b2.losses) == 8


@pytest.mark.parametrize("stops", [(7, 9), (3, 12), (5, 11)])
def test_resume_twice_is_bit_identical(tmp_path, stops):
    """Stop, resume, stop again (same or a later epoch), resume again: still the uninterrupted run."""
    a, _, data_a = run_fit(tmp_path, max_epochs=3)
    _, trainer, data = run_fit(tmp_path, max_epochs=3, max_steps=stops[0])
    reads = data.reads
    for i, stop in enumerate([*stops[1:], -1]):
        path = str(tmp_path / f"r{i}.ckpt")
        trainer.save_checkpoint(path)
        b, trainer, data = run_fit(tmp_path, seed=50 + i, ckpt_path=path, max_epochs=3, max_steps=stop)
        reads += data.reads
    assert_equal_weights(a, b)
    assert reads == data_a.reads


def test_resume_reads_only_the_remaining_batches(tmp_path):
    _, _, data_b1 = run_fit(tmp_path, max_epochs=3, max_steps=7)
    path = str(tmp_path / "b.ckpt")
    _, trainer, _ = run_fit(tmp_path, max_epochs=3, max_steps=7)
    trainer.save_checkpoint(path)
    _, _, data_b2 = run_fit(tmp_path, seed=5, ckpt_path=path, max_epochs=3)
    assert data_b1.reads == 7 * 4
    assert data_b2.reads == 8 * 4  # 3 batches left of epoch 1, 5 of epoch 2


def test_resume_detects_a_broken_restore(tmp_path):
    """The comparison can fail: resuming without the optimizer state gives different weights."""
    a, _, _ = run_fit(tmp_path, max_epochs=2)
    _, trainer, _ = run_fit(tmp_path, max_epochs=2, max_steps=3)
    path = str(tmp_path / "b.ckpt")
    trainer.save_checkpoint(path, weights_only=True)
    b, _, _ = run_fit(tmp_path, seed=0, ckpt_path=path, max_epochs=2)
    assert not all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_resume_at_epoch_boundary_after_max_epochs(tmp_path):
    _resume_case(tmp_path, {"max_epochs": 1}, max_epochs=3)


def test_resume_at_epoch_boundary_after_max_steps(tmp_path):
    _, b1, _, trainer = _resume_case(tmp_path, {"max_steps": 10}, max_epochs=3)
    assert trainer.current_epoch == 2 and loop_state(trainer).batch_in_epoch == 0


def test_resume_from_checkpoint_saved_in_epoch_end_hook(tmp_path):
    """A checkpoint written from on_train_epoch_end (as ModelCheckpoint does) resumes exactly too."""

    class Saver(Net):
        def on_train_epoch_end(self):
            if self.current_epoch == 0 and getattr(self, "save_to", None):
                self.trainer.save_checkpoint(self.save_to)

    path = str(tmp_path / "epoch0.ckpt")
    Saver.save_to = None
    a, _, _ = run_fit(tmp_path, max_epochs=3, task_cls=Saver)
    Saver.save_to = path
    run_fit(tmp_path, max_epochs=3, task_cls=Saver)
    Saver.save_to = None
    b, trainer_b, _ = run_fit(tmp_path, seed=9, ckpt_path=path, max_epochs=3, task_cls=Saver)
    assert_equal_weights(a, b)
    assert b.losses == a.losses[5:]
    assert trainer_b.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.1 * 0.7**3)


@pytest.mark.parametrize("save_at", [2, 4, 7])
def test_resume_from_checkpoint_saved_in_train_batch_end(tmp_path, save_at):
    """A checkpoint written in on_train_batch_end (ModelCheckpoint(every_n_train_steps=...)) just before a
    mid-epoch validation resumes exactly: the validation that was still due runs first."""

    class Saver(Net):
        save_to: str | None = None

        def on_train_batch_end(self, outputs, batch, batch_idx):
            if self.save_to and self.global_step == save_at:
                self.trainer.save_checkpoint(self.save_to)

    path = str(tmp_path / "batch.ckpt")
    common = dict(max_epochs=3, task_cls=Saver, val=True, val_check_interval=2)
    a, _, _ = run_fit(tmp_path, **common)
    Saver.save_to = path
    run_fit(tmp_path, **common)
    Saver.save_to = None
    b, _, _ = run_fit(tmp_path, seed=9, ckpt_path=path, **common)
    assert_equal_weights(a, b)
    assert b.losses == a.losses[save_at:]
    assert b.val_losses == a.val_losses[-len(b.val_losses) :]
    # validation after batches 2 and 4 of each 5-batch epoch; as Lightning, not again at the epoch's end
    val_steps = [2, 4, 7, 9, 12, 14]
    assert len(b.val_losses) == 2 * len([s for s in val_steps if s >= save_at])  # the due one is not lost


@pytest.mark.parametrize("stop", [5, 6, 10])
def test_resume_with_gradient_accumulation(tmp_path, stop):
    # 5 batches, k=2: 3 optimizer steps per epoch (windows 2, 2, 1)
    a, b1, b2, _ = _resume_case(tmp_path, {"max_steps": stop}, max_epochs=4, accumulate_grad_batches=2)
    assert len(b1.losses) + len(b2.losses) == 20


def test_resume_with_validation_and_sanity_steps(tmp_path):
    a, b1, b2, _ = _resume_case(
        tmp_path, {"max_steps": 7}, max_epochs=3, val=True, num_sanity_val_steps=2, val_check_interval=2
    )
    # sanity checking (2 batches) ran in both parts of the interrupted run; afterwards, validation matches
    assert b1.val_losses[2:] + b2.val_losses[2:] == a.val_losses[2:]


def test_resume_restores_loop_counters_and_hparams(tmp_path):
    _, trainer, _ = run_fit(tmp_path, max_epochs=3, max_steps=7, task_kw={"hidden": 8})
    path = str(tmp_path / "b.ckpt")
    trainer.save_checkpoint(path)
    ckpt = torch.load(path, weights_only=False)
    # stopped inside epoch 1: Lightning counts it as done (epoch 2); the loop part says it was cut at batch 2
    assert ckpt["global_step"] == 7 and ckpt["epoch"] == 2
    assert ckpt["loop"]["batch_in_epoch"] == 2 and ckpt["loop"]["epoch_counted"]
    assert ckpt["hyper_parameters"] == {"hidden": 8, "optimizer": "sgd"}
    assert len(ckpt["optimizer_states"]) == 1 and len(ckpt["lr_schedulers"]) == 1


def test_on_save_and_on_load_checkpoint_hooks(tmp_path):
    seen = {}

    class Hooked(Net):
        def on_save_checkpoint(self, checkpoint):
            checkpoint["extra"] = 42

        def on_load_checkpoint(self, checkpoint):
            seen["extra"] = checkpoint["extra"]

    _, trainer, _ = run_fit(tmp_path, max_steps=2, task_cls=Hooked)
    path = str(tmp_path / "h.ckpt")
    trainer.save_checkpoint(path)
    run_fit(tmp_path, ckpt_path=path, max_steps=3, task_cls=Hooked)
    assert seen == {"extra": 42}


def test_validate_with_ckpt_path_loads_weights(tmp_path):
    a, trainer, _ = run_fit(tmp_path, max_steps=3)
    path = str(tmp_path / "w.ckpt")
    trainer.save_checkpoint(path)
    torch.manual_seed(42)
    fresh = Net()
    Trainer(default_root_dir=str(tmp_path), **FAST).validate(
        fresh, DataLoader(CountingData(8), 4), ckpt_path=path
    )
    assert_equal_weights(a, fresh)


def test_resume_from_inside_an_accumulation_window_is_exact(tmp_path):
    """A stop request inside a window waits for its boundary; a checkpoint saved inside one keeps the
    gradients accumulated so far, so either resume equals the uninterrupted run."""

    class Lin(Task):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return F.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    class StopAt2(Callback):
        def on_train_batch_end(self, trainer, task, outputs, batch, batch_idx):
            if batch_idx == 2:  # opens the window {2, 3}
                trainer.should_stop = True

    class SaveAt4(Callback):
        def on_train_batch_end(self, trainer, task, outputs, batch, batch_idx):
            if batch_idx == 4:
                trainer.save_checkpoint(str(tmp_path / "mid.ckpt"))

    def data():
        g = torch.Generator().manual_seed(0)
        return DataLoader(
            TensorDataset(torch.randn(32, 4, generator=g), torch.randn(32, 1, generator=g)), batch_size=4
        )

    kw = dict(
        max_epochs=1,
        accumulate_grad_batches=2,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
    )
    seed_everything(0)
    stopped = Trainer(
        **kw, callbacks=[StopAt2(), ModelCheckpoint(dirpath=str(tmp_path / "c"), save_last=True)]
    )
    stopped.fit(Lin(), data())
    assert loop_state(stopped).batch_in_epoch == 4  # ran to the end of the window before stopping
    seed_everything(0)
    full = Lin()
    Trainer(**kw, enable_checkpointing=False, callbacks=[SaveAt4()]).fit(full, data())
    for path in (tmp_path / "c" / "last.ckpt", tmp_path / "mid.ckpt"):
        seed_everything(0)
        resumed = Lin()
        Trainer(**kw, enable_checkpointing=False).fit(resumed, data(), ckpt_path=str(path))
        assert torch.equal(full.net.weight, resumed.net.weight), path
