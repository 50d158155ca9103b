"""ModelCheckpoint as Lightning's own tests expect it (issue 36): when step saves of a validation metric wait
for the validation, which files stay, what its scores are; each compared with Lightning (pytorch_lightning 2.6.6)
where it can be."""

from __future__ import annotations

import os
import warnings

import pytest
import torch
from helpers.parity_callbacks import (
    QUIET,
)
from helpers.parity_callbacks import (
    Calls as _Calls,
)
from helpers.parity_callbacks import (
    LightningCalls as _LightningCalls,
)
from helpers.parity_callbacks import (
    loader as _loader,
)

from callbacks import ModelCheckpoint
from trainer import Trainer

pl = pytest.importorskip("pytorch_lightning")


class _Scores(_Calls):
    """Logs the next of `scores` at each validation's end."""

    def __init__(self, scores: list[float]) -> None:
        super().__init__()
        self.scores = list(scores)

    def on_validation_epoch_end(self) -> None:
        self.log("auroc", self.scores.pop(0))

    def train_dataloader(self):
        return _loader(4)


class _LightningScores(_LightningCalls):
    on_validation_epoch_end, train_dataloader = _Scores.on_validation_epoch_end, _Scores.train_dataloader

    def __init__(self, scores: list[float]) -> None:
        super().__init__()
        self.scores = list(scores)


@pytest.mark.parametrize(
    ("trigger", "options"),
    [
        (dict(every_n_train_steps=1), dict(max_epochs=1, val_check_interval=0.5)),
        (dict(every_n_train_steps=3), dict(max_epochs=2, val_check_interval=0.5)),
        (dict(train_time_interval=0), dict(max_epochs=2, check_val_every_n_epoch=2)),
    ],
)
def test_step_saves_wait_for_the_validation_that_logs_the_monitored_key(tmp_path, trigger, options):
    """A step- or time-triggered save of a validation metric waits for the validation's end when the key is
    not logged yet, or when the epoch's last batch would save a stale value (Lightning 2.6)."""
    from datetime import timedelta

    if "train_time_interval" in trigger:
        trigger = dict(train_time_interval=timedelta(seconds=0))  # zero is an interval: every step
    scores = [0.1, 0.9, 0.5, 0.7]
    kw = dict(
        monitor="auroc", mode="max", save_top_k=-1, every_n_epochs=0, save_on_train_epoch_end=False, **trigger
    )
    ours = ModelCheckpoint(dirpath=tmp_path / "ours", **kw)
    Trainer(callbacks=[ours], default_root_dir=tmp_path, **QUIET, **options).fit(_Scores(scores))
    theirs = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "theirs", **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pl.Trainer(callbacks=[theirs], default_root_dir=tmp_path, accelerator="cpu", **QUIET, **options).fit(
            _LightningScores(scores)
        )
    assert sorted(os.listdir(tmp_path / "ours")) == sorted(os.listdir(tmp_path / "theirs"))
    assert {os.path.basename(p): round(float(v), 4) for p, v in ours.best_k_models.items()} == {
        os.path.basename(p): round(float(v), 4) for p, v in theirs.best_k_models.items()
    }
    assert float(ours.best_model_score) == pytest.approx(float(theirs.best_model_score))


def test_model_checkpoint_dirpath_expands_home_and_scores_are_tensors(tmp_path):
    from pathlib import Path

    assert (
        ModelCheckpoint(dirpath="~/ckpts").dirpath == pl.callbacks.ModelCheckpoint(dirpath="~/ckpts").dirpath
    )
    assert ModelCheckpoint(dirpath="~/ckpts").dirpath == str(Path.home() / "ckpts")
    assert ModelCheckpoint(dirpath="./~/c").dirpath == str(Path.cwd() / "~" / "c")
    cb = ModelCheckpoint(dirpath=tmp_path, monitor="x")
    cb.best_model_score = torch.tensor(2.5)  # assignable, as Lightning's attribute
    assert float(cb.best_model_score) == 2.5


class _StepScore(_Calls):
    def training_step(self, batch, batch_idx):
        self.log("score", torch.tensor(0.1 * (self.global_step + 1)))  # a float32 tensor, as self.log keeps
        return super().training_step(batch, batch_idx)


def test_current_score_equals_the_logged_float32_value(tmp_path):
    cb = ModelCheckpoint(dirpath=tmp_path, monitor="score", mode="max", every_n_train_steps=1)
    Trainer(max_steps=3, callbacks=[cb], default_root_dir=tmp_path, **QUIET).fit(_StepScore())
    assert cb.current_score == torch.tensor(0.3) and cb.current_score == 0.3  # not 0.30000001192092896


def test_the_checkpoint_resumed_from_is_not_deleted_from_the_top_k(tmp_path):
    """Resuming into the same directory: the file resumed from stays when it falls out of the top k."""
    kw = dict(dirpath=tmp_path, monitor="step", mode="max", save_top_k=2, every_n_train_steps=2)
    opts = dict(default_root_dir=tmp_path, limit_val_batches=0, **QUIET)
    task = _Calls()
    Trainer(max_steps=4, callbacks=[ModelCheckpoint(**kw)], **opts).fit(task)
    assert sorted(os.listdir(tmp_path)) == ["epoch=0-step=2.ckpt", "epoch=0-step=4.ckpt"]
    resume = str(tmp_path / "epoch=0-step=4.ckpt")
    Trainer(max_steps=8, callbacks=[ModelCheckpoint(**kw)], **opts).fit(_Calls(), ckpt_path=resume)
    assert sorted(os.listdir(tmp_path)) == [
        "epoch=0-step=4.ckpt",  # resumed from: kept (Lightning keeps it too); step 2 fell out
        "epoch=1-step=6.ckpt",
        "epoch=1-step=8.ckpt",
    ]


def test_a_fitted_trainer_pickles_and_loads_back(tmp_path):
    """torch.save(trainer) / torch.load(weights_only=False) after fit (Lightning's test_model_torch_save):
    unpickling the optimizer wrapper used to recurse without end."""
    trainer = Trainer(max_epochs=1, default_root_dir=tmp_path, **QUIET)
    trainer.fit(_Calls())
    torch.save(trainer.model, tmp_path / "model.pt")
    torch.save(trainer, tmp_path / "trainer.pt")
    again = torch.load(tmp_path / "trainer.pt", weights_only=False)
    assert again.global_step == trainer.global_step == 5
