"""resume="auto" finds every form of last checkpoint Tandem writes: a file, a sharded directory (FSDP), a
save_last="link" link to either, last-vN, and a directory a crashed save left moved aside (last.ckpt.old-*).
Each resume is checked at the step it starts from, and against an uninterrupted run."""

from __future__ import annotations

import os
import sys
import warnings

import pytest
import torch
from conftest import FAST
from torch.utils.data import DataLoader

from callbacks import Callback, ModelCheckpoint
from callbacks import checkpoint_names as names
from strategies.fsdp import FSDPStrategy
from tandem_core.errors import CheckpointError
from trainer import Trainer

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts"))
from fsdp_train import Tower, make_data  # noqa: E402


class StartStep(Callback):
    """The global step training starts (or resumes) at, and the first training step's."""

    def __init__(self) -> None:
        self.at_start, self.first = -1, -1

    def on_train_start(self, trainer, task):
        self.at_start = trainer.global_step

    def on_train_batch_start(self, trainer, task, batch, batch_idx):
        if self.first < 0:
            self.first = trainer.global_step


def fit(root, steps: int, strategy="fsdp", save_last=True, top_k=0, **kwargs):
    """Tower on 48 samples (4 steps an epoch), a last checkpoint every step under root/ckpts."""
    start = StartStep()
    checkpoint = ModelCheckpoint(
        dirpath=os.path.join(root, "ckpts"), every_n_train_steps=1, save_last=save_last, save_top_k=top_k
    )
    trainer = Trainer(
        strategy=FSDPStrategy() if strategy == "fsdp" else strategy,
        devices=1,
        max_steps=steps,
        max_epochs=100,
        default_root_dir=str(root),
        callbacks=[checkpoint, start],
        **{**FAST, "enable_checkpointing": True},
        **kwargs,
    )
    task = Tower(opt="adam")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*nothing to shard")
        trainer.fit(task, DataLoader(make_data(), batch_size=12))
    return trainer, task, start


def weights(task) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in task.parameters()])


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted run to step 6 (the fsdp strategy in one process trains unsharded)."""
    return weights(fit(tmp_path_factory.mktemp("reference"), 6)[1])


def listing(root) -> list[str]:
    return sorted(os.listdir(os.path.join(root, "ckpts")))


@pytest.mark.parametrize("strategy", ["fsdp", "single"])
def test_auto_resumes_the_last_directory_or_file_at_its_step(tmp_path, reference, strategy):
    """Before: FSDP's last.ckpt directory was not found, the run began at step 0 and wrote last-v1.ckpt."""
    fit(tmp_path, 3, strategy)
    assert os.path.isdir(tmp_path / "ckpts" / "last.ckpt") == (strategy == "fsdp")
    trainer, task, start = fit(tmp_path, 6, strategy, resume="auto")
    assert (start.at_start, start.first, trainer.global_step) == (3, 3, 6)
    assert listing(tmp_path) == ["last.ckpt"]  # replaced, no last-v1.ckpt beside it
    torch.testing.assert_close(weights(task), reference, rtol=0, atol=0)


def test_auto_follows_a_save_last_link_to_a_sharded_directory(tmp_path, reference):
    fit(tmp_path, 3, save_last="link", top_k=1)
    link = tmp_path / "ckpts" / "last.ckpt"
    assert os.path.islink(link) and os.path.isdir(link)
    trainer, task, start = fit(tmp_path, 6, save_last="link", top_k=1, resume="auto")
    assert (start.at_start, trainer.global_step) == (3, 6)
    torch.testing.assert_close(weights(task), reference, rtol=0, atol=0)


def test_auto_resumes_a_directory_a_crashed_save_moved_aside(tmp_path, reference, capsys):
    """A save that replaces a directory renames the old one to last.ckpt.old-<id> first; a crash before the
    new one is renamed in leaves only that (and a temporary), which the loader reads."""
    fit(tmp_path, 3)
    aside = tmp_path / "ckpts" / "last.ckpt.old-0123456789ab"
    os.rename(tmp_path / "ckpts" / "last.ckpt", aside)
    capsys.readouterr()
    trainer, task, start = fit(tmp_path, 6, resume="auto")
    assert f"Restored from {aside} (epoch 0, step 3)" in capsys.readouterr().out
    assert (start.at_start, trainer.global_step) == (3, 6)
    torch.testing.assert_close(weights(task), reference, rtol=0, atol=0)


def test_the_newest_of_every_form_wins(tmp_path):
    (tmp_path / "last.ckpt").write_bytes(b"x")
    os.mkdir(tmp_path / "last-v1.ckpt")
    os.utime(tmp_path / "last.ckpt", (1, 1))
    assert names.newest_last([str(tmp_path)]) == str(tmp_path / "last-v1.ckpt")
    os.utime(tmp_path / "last-v1.ckpt", (0, 0))
    assert names.newest_last([str(tmp_path)]) == str(tmp_path / "last.ckpt")


def test_a_copy_moved_aside_counts_only_without_its_entry(tmp_path):
    os.mkdir(tmp_path / "last.ckpt.old-0123456789ab")
    assert names.newest_last([str(tmp_path)]) == str(tmp_path / "last.ckpt.old-0123456789ab")
    os.mkdir(tmp_path / "last.ckpt")
    os.utime(tmp_path / "last.ckpt", (0, 0))  # older, but the save's own result
    assert names.newest_last([str(tmp_path)]) == str(tmp_path / "last.ckpt")


def test_a_directory_link_out_of_the_directory_and_other_names_are_not_taken(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "last.ckpt").mkdir(parents=True)
    ckpts = tmp_path / "ckpts"
    ckpts.mkdir()
    os.symlink(elsewhere / "last.ckpt", ckpts / "last.ckpt")  # a checkpoint of another place
    os.symlink(ckpts, ckpts / "last-v1.ckpt")  # a loop
    for stray in ("last.ckpt.tmp-0123456789ab", "last.ckpt.old-xyz", "last-v1.ckpt.bak"):
        os.mkdir(ckpts / stray)
    assert names.newest_last([str(ckpts)]) is None


def test_a_last_directory_that_is_no_checkpoint_is_an_error_not_a_fresh_start(tmp_path):
    """It is this run's last.ckpt by name and place: a broken one is reported, as a broken file is."""
    os.makedirs(tmp_path / "ckpts" / "last.ckpt")
    with pytest.raises(CheckpointError, match=r"ckpts/last\.ckpt/tandem\.pt' does not exist"):
        fit(tmp_path, 2, resume="auto")


def test_a_deletion_cut_short_never_leaves_part_of_a_directory_under_a_checkpoint_name(tmp_path, monkeypatch):
    """Top-k deletes an older sharded checkpoint while training goes on; a kill during the deletion (here its
    rmtree failing after the first file) leaves the remains under a temporary name, never under the
    checkpoint's, and a copy a crash had moved aside is gone first (reading it never falls back to one)."""
    from strategies.checkpoint import directory
    from strategies.checkpoint.io import TorchCheckpointIO

    ckpt = tmp_path / "epoch=1-step=5.ckpt"
    for d in (ckpt, tmp_path / "epoch=1-step=5.ckpt.old-0123456789ab"):
        d.mkdir()
        for f in ("__0_0.distcp", "__1_0.distcp", ".metadata", "tandem.pt"):
            (d / f).write_bytes(b"x")

    def killed(path, *args, **kwargs):  # the kill: one file deleted, then the process is gone
        os.remove(os.path.join(path, sorted(os.listdir(path))[0]))
        raise KeyboardInterrupt

    monkeypatch.setattr(directory.shutil, "rmtree", killed)
    with pytest.raises(KeyboardInterrupt):
        TorchCheckpointIO().remove_checkpoint(str(ckpt))
    left = sorted(os.listdir(tmp_path))
    assert [n for n in left if not n.startswith("epoch=1-step=5.ckpt.tmp-")] == ["epoch=1-step=5.ckpt"]
    assert sorted(os.listdir(ckpt)) == [".metadata", "__0_0.distcp", "__1_0.distcp", "tandem.pt"]  # whole
    monkeypatch.undo()
    TorchCheckpointIO().remove_checkpoint(str(ckpt))
    assert all(n.startswith("epoch=1-step=5.ckpt.tmp-") for n in os.listdir(tmp_path))
