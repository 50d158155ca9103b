"""Hook by hook, Lightning's order and arguments: each scenario records every call of a hooked task, callback
and DataModule (tests/ports/hookrec.py) and compares it with the sequence recorded from Lightning 2.6.6 in
tests/ports/hook_order/. The scenarios are those of Lightning's tests/tests_pytorch/models/test_hooks.py plus
accumulation with clipping, schedulers, val_check_interval, early stopping, an exception and two loaders.
`python -m tests.ports.lightning_check -k hook_order` runs the same file on Lightning itself."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from callbacks import EarlyStopping
from tests.ports.harness import QUIET
from tests.ports.hookrec import DM_NAMES, Boring, BoringDataModule, RandomDataset, check, hooked, recording
from trainer import Trainer


def _trainer(root: Any, callbacks: list[Any], **kwargs: Any) -> Trainer:
    opts = dict(max_epochs=1, limit_train_batches=2, limit_val_batches=2, logger=False, **QUIET)
    return Trainer(default_root_dir=str(root), callbacks=callbacks, **{**opts, **kwargs})


class Manual(Boring):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        loss = self.loss(self(batch))
        opt = self.optimizers()
        opt.zero_grad()
        self.manual_backward(loss)
        opt.step()
        return {"loss": loss}


class ManualTwo(Boring):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.other = torch.nn.Linear(32, 2)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        for opt, layer in zip(self.optimizers(), (self.layer, self.other)):
            loss = self.loss(layer(batch))
            opt.zero_grad()
            self.manual_backward(loss)
            opt.step()
        return {"loss": loss}

    def configure_optimizers(self) -> Any:
        return [
            torch.optim.SGD(self.layer.parameters(), lr=0.1),
            torch.optim.SGD(self.other.parameters(), lr=0.1),
        ]


@pytest.mark.parametrize("base", [Boring, Manual, ManualTwo], ids=["auto", "manual", "manual_two"])
def test_hook_order_fit(base, tmp_path):
    log: list[str] = []
    task_cls, cb = hooked(log, base)
    _trainer(tmp_path, [cb]).fit(task_cls())
    check(f"fit_{base.__name__.lower()}", log)


@pytest.mark.parametrize("by", ["max_epochs", "max_steps"])
def test_hook_order_resume(by, tmp_path):
    first = dict(max_epochs=1) if by == "max_epochs" else dict(max_steps=1, max_epochs=-1)
    trainer = _trainer(tmp_path, [], limit_val_batches=0, **first)
    trainer.fit(Boring())
    path = trainer.checkpoint_callback.best_model_path
    log: list[str] = []
    task_cls, cb = hooked(log)
    again = dict(max_epochs=2) if by == "max_epochs" else dict(max_steps=3, max_epochs=-1)
    _trainer(tmp_path, [cb], limit_val_batches=0, **again).fit(task_cls(), ckpt_path=path)
    check(f"resume_{by}", log)


@pytest.mark.parametrize("batches", [0, 2])
@pytest.mark.parametrize("verb", ["validate", "test"])
def test_hook_order_eval(verb, batches, tmp_path):
    log: list[str] = []
    task_cls, cb = hooked(log)
    trainer = _trainer(tmp_path, [cb], limit_val_batches=batches, limit_test_batches=batches)
    getattr(trainer, verb)(task_cls(), verbose=False)
    check(f"{verb}_{batches}", log)


def test_hook_order_predict(tmp_path):
    log: list[str] = []
    task_cls, cb = hooked(log)
    _trainer(tmp_path, [cb], limit_predict_batches=2).predict(task_cls())
    check("predict", log)


@pytest.mark.parametrize("verb", ["fit", "validate", "test", "predict"])
def test_hook_order_datamodule(verb, tmp_path):
    log: list[str] = []
    dm = recording(BoringDataModule, DM_NAMES, log)()
    trainer = _trainer(tmp_path, [], limit_test_batches=2, limit_predict_batches=2)
    kwargs = {} if verb in ("fit", "predict") else {"verbose": False}
    getattr(trainer, verb)(Boring(), datamodule=dm, **kwargs)
    check(f"datamodule_{verb}", log)


class TransferDataModule(BoringDataModule):
    """A DataModule with its own batch-transfer hooks (the task has none): Lightning calls the DataModule's."""

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        return batch

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        return batch.to(device)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        return batch * 1


def test_hook_order_datamodule_batch_transfer(tmp_path):
    log: list[str] = []
    dm = recording(TransferDataModule, DM_NAMES, log)()
    _trainer(tmp_path, [], limit_train_batches=1, limit_val_batches=1, num_sanity_val_steps=0).fit(
        Boring(), datamodule=dm
    )
    check("datamodule_batch_transfer", log)


def test_hook_order_load_from_checkpoint(tmp_path):
    trainer = _trainer(tmp_path, [], max_steps=1, limit_val_batches=0)
    trainer.fit(Boring(), datamodule=BoringDataModule())
    path = os.path.join(str(tmp_path), "saved.ckpt")
    trainer.save_checkpoint(path)
    log: list[str] = []
    task_cls, _ = hooked(log)
    task_cls.load_from_checkpoint(path)
    recording(BoringDataModule, DM_NAMES, log).load_from_checkpoint(path)
    check("load_from_checkpoint", log)


def test_hook_order_accumulation_and_clipping(tmp_path):
    log: list[str] = []
    task_cls, cb = hooked(log)
    trainer = _trainer(
        tmp_path,
        [cb],
        limit_train_batches=4,
        limit_val_batches=0,
        accumulate_grad_batches=2,
        gradient_clip_val=0.5,
    )
    trainer.fit(task_cls())
    check("accumulation_clipping", log)


class Schedulers(Boring):
    """A step-interval scheduler, an epoch one, and ReduceLROnPlateau on a validation metric."""

    def __init__(self) -> None:
        super().__init__()
        self.other = torch.nn.Linear(32, 2)

    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        loss = self.loss(self(batch))
        self.log("val_x", loss)
        return {"x": loss}

    def configure_optimizers(self) -> Any:
        opt = torch.optim.SGD(self.parameters(), lr=0.1)
        step = torch.optim.lr_scheduler.StepLR(opt, step_size=1)
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt)
        epoch = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.9)
        return [opt], [
            {"scheduler": step, "interval": "step"},
            {"scheduler": epoch, "interval": "epoch"},
            {"scheduler": plateau, "monitor": "val_x"},
        ]


def test_hook_order_schedulers(tmp_path):
    log: list[str] = []
    task_cls, cb = hooked(log, Schedulers)
    _trainer(tmp_path, [cb], max_epochs=2, num_sanity_val_steps=0).fit(task_cls())
    check("schedulers", log)


def test_hook_order_val_check_interval(tmp_path):
    log: list[str] = []
    task_cls, cb = hooked(log)
    _trainer(tmp_path, [cb], limit_train_batches=4, val_check_interval=2, limit_val_batches=1).fit(task_cls())
    check("val_check_interval", log)


def test_hook_order_early_stopping(tmp_path):
    log: list[str] = []
    task_cls, cb = hooked(log, Schedulers)
    stop = EarlyStopping(monitor="val_x", patience=0, min_delta=1e9)
    _trainer(tmp_path, [cb, stop], max_epochs=5, limit_val_batches=1, num_sanity_val_steps=0).fit(task_cls())
    check("early_stopping", log)


class Failing(Boring):
    def training_step(self, batch: Any, batch_idx: int) -> Any:
        if batch_idx == 1:
            raise RuntimeError("deliberate")
        return super().training_step(batch, batch_idx)


def test_hook_order_exception(tmp_path):
    log: list[str] = []
    task_cls, cb = hooked(log, Failing)
    with pytest.raises(RuntimeError, match="deliberate"):
        _trainer(tmp_path, [cb], num_sanity_val_steps=0).fit(task_cls())
    check("exception", log)


class TwoLoaders(Boring):
    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Any:
        return {"x": self.loss(self(batch))}

    def val_dataloader(self) -> Any:
        return [DataLoader(RandomDataset()), DataLoader(RandomDataset())]


def test_hook_order_two_validation_loaders(tmp_path):
    log: list[str] = []
    task_cls, cb = hooked(log, TwoLoaders)
    _trainer(tmp_path, [cb], limit_train_batches=1, num_sanity_val_steps=0).fit(task_cls())
    check("two_val_loaders", log)
