"""Checkpoints: an interrupted and resumed run equals an uninterrupted one; atomic writes; checked reads."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F
from conftest import FAST
from torch import nn
from torch.utils.data import DataLoader, Dataset

from trainer import Task, Trainer
from trainer import checkpoint as ckpt_io
from trainer.errors import CheckpointError, TandemError


class CountingData(Dataset):
    """20 samples; counts __getitem__ calls so a test can see which batches were read."""

    def __init__(self, n: int = 20) -> None:
        g = torch.Generator().manual_seed(7)
        self.x, self.y = torch.randn(n, 4, generator=g), torch.randn(n, 1, generator=g)
        self.reads = 0

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        self.reads += 1
        return self.x[i], self.y[i]


class Net(Task):
    def __init__(self, hidden: int = 8, optimizer: str = "sgd") -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(4, hidden), nn.Tanh(), nn.Dropout(0.3), nn.Linear(hidden, 1))
        self.losses: list[float] = []
        self.val_losses: list[float] = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self.net(x), y)
        self.losses.append(loss.item())
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self.net(x), y)
        self.val_losses.append(loss.item())
        self.log("val/loss", loss)

    def configure_optimizers(self):
        if self.hparams.optimizer == "adam":
            opt = torch.optim.Adam(self.parameters(), lr=0.01)
        else:
            opt = torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)
        return {
            "optimizer": opt,
            "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7),
        }


def _run(tmp_path, *, seed: int = 0, ckpt_path=None, val: bool = False, task_cls=Net, task_kw=None, **kw):
    torch.manual_seed(seed)
    task = task_cls(**(task_kw or {}))
    data = CountingData()
    loader = DataLoader(data, batch_size=4, shuffle=True)
    val_loader = DataLoader(CountingData(8), batch_size=4) if val else None
    trainer = Trainer(default_root_dir=str(tmp_path), **{**FAST, **kw})
    trainer.fit(task, loader, val_loader, ckpt_path=ckpt_path)
    return task, trainer, data


def _assert_equal_weights(a: nn.Module, b: nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


def _resume_case(tmp_path, stop: dict, resume: dict | None = None, val: bool = False, **common):
    """Run A uninterrupted; run B stops per `stop`, saves, and a new Trainer and Task continue it."""
    a, trainer_a, data_a = _run(tmp_path, val=val, **common)
    b1, trainer_b1, data_b1 = _run(tmp_path, val=val, **{**common, **stop})
    path = str(tmp_path / "b.ckpt")
    trainer_b1.save_checkpoint(path)
    b2, trainer_b2, data_b2 = _run(
        tmp_path, seed=123, ckpt_path=path, val=val, **{**common, **(resume or {})}
    )
    _assert_equal_weights(a, b2)
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
    a, _, data_a = _run(tmp_path, max_epochs=3)
    _, trainer, data = _run(tmp_path, max_epochs=3, max_steps=stops[0])
    reads = data.reads
    for i, stop in enumerate([*stops[1:], -1]):
        path = str(tmp_path / f"r{i}.ckpt")
        trainer.save_checkpoint(path)
        b, trainer, data = _run(tmp_path, seed=50 + i, ckpt_path=path, max_epochs=3, max_steps=stop)
        reads += data.reads
    _assert_equal_weights(a, b)
    assert reads == data_a.reads


def test_resume_reads_only_the_remaining_batches(tmp_path):
    _, _, data_b1 = _run(tmp_path, max_epochs=3, max_steps=7)
    path = str(tmp_path / "b.ckpt")
    _, trainer, _ = _run(tmp_path, max_epochs=3, max_steps=7)
    trainer.save_checkpoint(path)
    _, _, data_b2 = _run(tmp_path, seed=5, ckpt_path=path, max_epochs=3)
    assert data_b1.reads == 7 * 4
    assert data_b2.reads == 8 * 4  # 3 batches left of epoch 1, 5 of epoch 2


def test_resume_detects_a_broken_restore(tmp_path):
    """The comparison can fail: resuming without the optimizer state gives different weights."""
    a, _, _ = _run(tmp_path, max_epochs=2)
    _, trainer, _ = _run(tmp_path, max_epochs=2, max_steps=3)
    path = str(tmp_path / "b.ckpt")
    trainer.save_checkpoint(path, weights_only=True)
    b, _, _ = _run(tmp_path, seed=0, ckpt_path=path, max_epochs=2)
    assert not all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_resume_at_epoch_boundary_after_max_epochs(tmp_path):
    _resume_case(tmp_path, {"max_epochs": 1}, max_epochs=3)


def test_resume_at_epoch_boundary_after_max_steps(tmp_path):
    _, b1, _, trainer = _resume_case(tmp_path, {"max_steps": 10}, max_epochs=3)
    assert trainer.current_epoch == 2 and trainer.batch_in_epoch == 0


def test_resume_from_checkpoint_saved_in_epoch_end_hook(tmp_path):
    """A checkpoint written from on_train_epoch_end (as ModelCheckpoint does) resumes exactly too."""

    class Saver(Net):
        def on_train_epoch_end(self):
            if self.current_epoch == 0 and getattr(self, "save_to", None):
                self.trainer.save_checkpoint(self.save_to)

    path = str(tmp_path / "epoch0.ckpt")
    Saver.save_to = None
    a, _, _ = _run(tmp_path, max_epochs=3, task_cls=Saver)
    Saver.save_to = path
    _run(tmp_path, max_epochs=3, task_cls=Saver)
    Saver.save_to = None
    b, trainer_b, _ = _run(tmp_path, seed=9, ckpt_path=path, max_epochs=3, task_cls=Saver)
    _assert_equal_weights(a, b)
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
    a, _, _ = _run(tmp_path, **common)
    Saver.save_to = path
    _run(tmp_path, **common)
    Saver.save_to = None
    b, _, _ = _run(tmp_path, seed=9, ckpt_path=path, **common)
    _assert_equal_weights(a, b)
    assert b.losses == a.losses[save_at:]
    assert b.val_losses == a.val_losses[-len(b.val_losses) :]
    val_steps = [2, 4, 5, 7, 9, 10, 12, 14, 15]  # validation after batches 2 and 4 and at each epoch's end
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
    _, trainer, _ = _run(tmp_path, max_epochs=3, max_steps=7, task_kw={"hidden": 8})
    path = str(tmp_path / "b.ckpt")
    trainer.save_checkpoint(path)
    ckpt = torch.load(path, weights_only=False)
    assert ckpt["global_step"] == 7 and ckpt["epoch"] == 1
    assert ckpt["loop"]["batch_in_epoch"] == 2
    assert ckpt["hyper_parameters"] == {"hidden": 8, "optimizer": "sgd"}
    assert len(ckpt["optimizer_states"]) == 1 and len(ckpt["lr_schedulers"]) == 1


def test_on_save_and_on_load_checkpoint_hooks(tmp_path):
    seen = {}

    class Hooked(Net):
        def on_save_checkpoint(self, checkpoint):
            checkpoint["extra"] = 42

        def on_load_checkpoint(self, checkpoint):
            seen["extra"] = checkpoint["extra"]

    _, trainer, _ = _run(tmp_path, max_steps=2, task_cls=Hooked)
    path = str(tmp_path / "h.ckpt")
    trainer.save_checkpoint(path)
    _run(tmp_path, ckpt_path=path, max_steps=3, task_cls=Hooked)
    assert seen == {"extra": 42}


def test_validate_with_ckpt_path_loads_weights(tmp_path):
    a, trainer, _ = _run(tmp_path, max_steps=3)
    path = str(tmp_path / "w.ckpt")
    trainer.save_checkpoint(path)
    torch.manual_seed(42)
    fresh = Net()
    Trainer(default_root_dir=str(tmp_path), **FAST).validate(
        fresh, DataLoader(CountingData(8), 4), ckpt_path=path
    )
    _assert_equal_weights(a, fresh)


# ----- user mistakes -----------------------------------------------------------------------------


def test_missing_ckpt_path_raises(tmp_path):
    missing = str(tmp_path / "nope.ckpt")
    with pytest.raises(CheckpointError, match="does not exist"):
        _run(tmp_path, ckpt_path=missing, max_steps=1)


def test_checkpoint_from_a_different_model_names_the_keys(tmp_path):
    _, trainer, _ = _run(tmp_path, max_steps=1, task_kw={"hidden": 8})
    path = str(tmp_path / "h8.ckpt")
    trainer.save_checkpoint(path)
    with pytest.raises(CheckpointError, match=r"net\.0\.weight") as info:
        _run(tmp_path, ckpt_path=path, max_steps=2, task_kw={"hidden": 6})
    assert "(6, 4)" in str(info.value) and "(8, 4)" in str(info.value)
    assert isinstance(info.value, TandemError)

    class Other(Net):
        def __init__(self, **kw) -> None:
            super().__init__(**kw)
            self.extra = nn.Linear(2, 2)

    with pytest.raises(CheckpointError, match=r"missing keys \['extra\.weight', 'extra\.bias'\]"):
        _run(tmp_path, ckpt_path=path, max_steps=2, task_cls=Other)


def test_not_a_checkpoint_raises(tmp_path):
    path = tmp_path / "junk.ckpt"
    path.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="could not be read"):
        ckpt_io.load(path)
    torch.save({"weights": 1}, path)
    with pytest.raises(CheckpointError, match="not a Tandem checkpoint"):
        ckpt_io.load(path)


def test_save_checkpoint_before_fit_raises(tmp_path):
    with pytest.raises(CheckpointError, match="during or after fit"):
        Trainer(default_root_dir=str(tmp_path), **FAST).save_checkpoint(str(tmp_path / "x.ckpt"))


# ----- atomic write ------------------------------------------------------------------------------


def test_atomic_save_writes_and_leaves_no_temp_file(tmp_path):
    path = tmp_path / "sub" / "a.ckpt"
    ckpt_io.atomic_save({"state_dict": {"w": torch.ones(2)}}, path)
    assert torch.equal(torch.load(path)["state_dict"]["w"], torch.ones(2))
    ckpt_io.atomic_save({"state_dict": {"w": torch.zeros(2)}}, path)
    assert torch.equal(torch.load(path)["state_dict"]["w"], torch.zeros(2))
    assert os.listdir(tmp_path / "sub") == ["a.ckpt"]


@pytest.mark.parametrize("exc", [RuntimeError("disk full"), KeyboardInterrupt()])
def test_atomic_save_failure_keeps_previous_file(tmp_path, monkeypatch, exc):
    path = tmp_path / "a.ckpt"
    ckpt_io.atomic_save({"state_dict": {"w": torch.ones(3)}}, path)
    before = path.read_bytes()

    def broken_save(obj, f, *a, **k):
        f.write(b"partial")
        raise exc

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(type(exc)):
        ckpt_io.atomic_save({"state_dict": {"w": torch.zeros(3)}}, path)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["a.ckpt"]


def test_trainer_save_checkpoint_is_atomic(tmp_path, monkeypatch):
    _, trainer, _ = _run(tmp_path, max_steps=2)
    path = tmp_path / "t.ckpt"
    trainer.save_checkpoint(str(path))
    before = path.read_bytes()

    def broken_save(obj, f, *a, **k):
        raise OSError("no space left")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError):
        trainer.save_checkpoint(str(path))
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["t.ckpt"]


def test_resume_from_inside_an_accumulation_window_is_exact(tmp_path):
    """A stop request inside a window waits for its boundary; a checkpoint saved inside one keeps the
    gradients accumulated so far, so either resume equals the uninterrupted run."""
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, TensorDataset

    from callbacks import Callback, ModelCheckpoint
    from trainer import Task, Trainer, seed_everything

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
    assert stopped.batch_in_epoch == 4  # ran to the end of the window before stopping
    seed_everything(0)
    full = Lin()
    Trainer(**kw, enable_checkpointing=False, callbacks=[SaveAt4()]).fit(full, data())
    for path in (tmp_path / "c" / "last.ckpt", tmp_path / "mid.ckpt"):
        seed_everything(0)
        resumed = Lin()
        Trainer(**kw, enable_checkpointing=False).fit(resumed, data(), ckpt_path=str(path))
        assert torch.equal(full.net.weight, resumed.net.weight), path
