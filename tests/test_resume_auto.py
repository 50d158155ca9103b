"""resume="auto" and ckpt_path="last" resume only this run's own checkpoints: never another experiment's,
a stray file under default_root_dir, or a file of another task; they survive symlink loops and files that
vanish mid-search, and every resume says from where (trainer/checkpoint/run.py, callbacks/checkpoint_names.py)."""

from __future__ import annotations

import os
import shutil
import time

import pytest
import torch
import torch.nn.functional as F
from conftest import FAST
from torch.utils.data import DataLoader, TensorDataset

from callbacks import ModelCheckpoint
from callbacks import checkpoint_names as names
from tandem_core.errors import CheckpointError
from trainer import Task, Trainer
from trainer.loggers import CSVLogger


class Linear(Task):
    def __init__(self, lr: float = 0.1) -> None:
        super().__init__()
        self.save_hyperparameters()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


class OtherLinear(Linear):
    """Same weights and hyperparameters, another task: its checkpoints are not Linear's to resume."""


def loader() -> DataLoader:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(16, 4, generator=g)
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)


def fit(
    root, steps: int, name: str = "exp", task: Task | None = None, ckpt_path: str | None = None, **kwargs
) -> tuple[Trainer, Task]:
    task = task if task is not None else Linear()
    options = {
        **FAST,
        "enable_checkpointing": True,
        "logger": CSVLogger(str(root), name=name),
        "callbacks": [ModelCheckpoint(save_last=True)],
    }
    trainer = Trainer(**{**options, **kwargs}, default_root_dir=str(root), max_steps=steps, max_epochs=100)
    trainer.fit(task, loader(), ckpt_path=ckpt_path)
    return trainer, task


def weights(task: Task) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in task.parameters()])


def restored_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("Restored from ")]


def test_auto_resumes_its_own_run_like_an_uninterrupted_one(tmp_path, capsys):
    _, reference = fit(tmp_path / "reference", 6)
    first, _ = fit(tmp_path / "run", 3)
    capsys.readouterr()
    resumed, task = fit(tmp_path / "run", 6, resume="auto")
    own = os.path.join(first.log_dir, "checkpoints", "last.ckpt")
    assert restored_lines(capsys.readouterr().out) == [f"Restored from {own} (epoch 0, step 3)"]
    assert resumed.log_dir != first.log_dir  # a new version_N, resumed from the experiment's earlier one
    assert resumed.global_step == 6
    torch.testing.assert_close(weights(task), weights(reference), rtol=0, atol=0)


def _strays(root) -> None:
    """What resume="auto" once picked up under default_root_dir: another experiment's newer last.ckpt, a
    downloaded one, a version_N symlink into the other experiment, and a symlink loop."""
    other, _ = fit(root, 2, name="other")
    theirs = os.path.join(other.log_dir, "checkpoints", "last.ckpt")
    os.makedirs(root / "downloads" / "pretrained")
    shutil.copy(theirs, root / "downloads" / "pretrained" / "last.ckpt")
    os.makedirs(root / "exp", exist_ok=True)
    os.symlink(other.log_dir, root / "exp" / "version_9")
    os.makedirs(root / "loop")
    for link in "ab":
        os.symlink(root / "loop", root / "loop" / link)


def test_auto_starts_fresh_beside_other_experiments_strays_and_a_symlink_loop(tmp_path, capsys):
    _, reference = fit(tmp_path / "reference", 4)
    _strays(tmp_path)
    _strays(tmp_path / "last")
    with pytest.warns(
        UserWarning, match="No checkpoint will be loaded"
    ):  # ckpt_path="last": Lightning's warning
        _, fresh = fit(tmp_path / "last", 4, ckpt_path="last")
    torch.testing.assert_close(weights(fresh), weights(reference), rtol=0, atol=0)
    capsys.readouterr()
    started = time.monotonic()
    trainer, task = fit(tmp_path, 4, resume="auto")
    assert time.monotonic() - started < 60  # the old recursive glob never returned from the loop
    assert restored_lines(capsys.readouterr().out) == []
    torch.testing.assert_close(weights(task), weights(reference), rtol=0, atol=0)  # fresh, step 0 on


def test_auto_resumes_its_own_run_among_strays(tmp_path, capsys):
    first, _ = fit(tmp_path, 3)
    _strays(tmp_path)  # written after it: newer files everywhere else
    capsys.readouterr()
    fit(tmp_path, 4, resume="auto")
    own = os.path.join(first.log_dir, "checkpoints", "last.ckpt")
    assert restored_lines(capsys.readouterr().out) == [f"Restored from {own} (epoch 0, step 3)"]


def test_a_checkpoint_of_another_task_starts_fresh_and_says_so(tmp_path, capsys):
    first, _ = fit(tmp_path, 3, task=OtherLinear())
    theirs = os.path.join(first.log_dir, "checkpoints", "last.ckpt")
    with pytest.raises(CheckpointError, match="saved by another run: task_class"):
        fit(tmp_path, 2, ckpt_path="last")
    capsys.readouterr()
    trainer, _ = fit(tmp_path, 2, resume="auto")
    out = capsys.readouterr().out
    assert restored_lines(out) == [] and trainer.global_step == 2
    assert f"not resuming {theirs}" in out and "OtherLinear" in out and "starting fresh" in out


def test_ckpt_path_last_takes_this_experiments_file_not_another_experiments(tmp_path, capsys):
    mine, _ = fit(tmp_path, 2)
    fit(tmp_path, 3, name="other")  # newer, in a sibling experiment
    capsys.readouterr()
    fit(tmp_path, 3, ckpt_path="last")
    own = os.path.join(mine.log_dir, "checkpoints", "last.ckpt")
    assert restored_lines(capsys.readouterr().out) == [f"Restored from {own} (epoch 0, step 2)"]


def test_different_hyperparameters_are_reported_by_key(tmp_path):
    fit(tmp_path, 2)
    with pytest.warns(UserWarning, match=r"other hyperparameters than this task's \(lr: 0.1 -> 0.05\)"):
        fit(tmp_path, 3, task=Linear(lr=0.05), resume="auto")


def test_same_hyperparameters_warn_nothing(tmp_path, recwarn):
    fit(tmp_path, 2)
    fit(tmp_path, 3, resume="auto")
    assert not [w for w in recwarn if "hyperparameters" in str(w.message)]


def test_a_file_deleted_while_listed_is_skipped(tmp_path, monkeypatch):
    for name in ("last.ckpt", "last-v1.ckpt"):
        (tmp_path / name).write_bytes(b"x")
    real = os.scandir

    class Listing:
        """os.scandir whose last-v1.ckpt is deleted by another run right after the listing."""

        def __init__(self, path):
            with real(path) as it:
                self.entries = list(it)
            os.remove(tmp_path / "last-v1.ckpt")

        def __enter__(self):
            return iter(self.entries)

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(names.os, "scandir", Listing)
    assert names.newest_last([str(tmp_path)]) == str(tmp_path / "last.ckpt")


def test_each_example_config_has_its_own_run_directory(monkeypatch):
    from trainer.config import resolve

    monkeypatch.setenv("TANDEM_RUNS", "/runs")
    folder = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "configs")
    roots = {n: resolve(os.path.join(folder, n))["trainer"]["default_root_dir"] for n in os.listdir(folder)}
    assert len(roots) >= 5 and len(set(roots.values())) == len(roots), roots
