"""Issue 24: a run's checkpoint files are its own. A stop signal never replaces another run's last.ckpt in a
shared directory (and resume="auto" finds the versioned file it wrote instead); a restored ModelCheckpoint
state (a crafted checkpoint) cannot make a run delete files it did not write, inside dirpath or outside
(trainer/checkpoint/find.py stop_path, callbacks/checkpoint_state.py)."""

from __future__ import annotations

import os
import signal
import warnings

import pytest
import torch
import torch.nn.functional as F
from conftest import FAST
from torch.utils.data import DataLoader, TensorDataset

from callbacks import ModelCheckpoint
from trainer import Task, Trainer
from trainer.checkpoint import load
from trainer.loggers import CSVLogger


class Linear(Task):
    def __init__(self, stop_at: int = -1) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(4, 1)
        self.stop_at = stop_at

    def training_step(self, batch, batch_idx):
        if self.global_step == self.stop_at:
            os.kill(os.getpid(), signal.SIGTERM)  # a scheduler's preemption
        x, y = batch
        loss = F.mse_loss(self.layer(x), y)
        self.log("loss", loss, on_step=False, on_epoch=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def loader() -> DataLoader:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(16, 4, generator=g)
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)


def fit(root, dirpath, name: str, steps: int, task: Task | None = None, **kwargs) -> Trainer:
    ckpt_path = kwargs.pop("ckpt_path", None)
    cb = kwargs.pop("checkpoint", None) or ModelCheckpoint(dirpath=str(dirpath), save_last=True)
    options = {**FAST, "enable_checkpointing": True, "logger": CSVLogger(str(root), name=name), **kwargs}
    trainer = Trainer(**options, callbacks=[cb], default_root_dir=str(root), max_steps=steps, max_epochs=100)
    trainer.fit(task if task is not None else Linear(), loader(), ckpt_path=ckpt_path)
    return trainer


def test_a_stop_beside_another_runs_last_ckpt_writes_its_own_file_and_resumes_from_it(tmp_path, capsys):
    shared = tmp_path / "shared"
    fit(tmp_path, shared, "first", 4)  # one epoch: its last.ckpt in the shared directory
    theirs = shared / "last.ckpt"
    before = theirs.read_bytes()
    with pytest.raises(SystemExit) as stop:
        fit(tmp_path, shared, "second", 8, Linear(stop_at=2))
    assert stop.value.code == 143
    assert theirs.read_bytes() == before  # the first run's file, byte for byte
    own = shared / "last-v1.ckpt"
    assert load(str(own))["global_step"] == 3 and load(str(own))["run_id"]["experiment"] == "second"
    assert f"checkpoint saved to {own}" in capsys.readouterr().err
    os.utime(theirs)  # the first run wrote again since: the newest last file is not the second's
    trainer = fit(tmp_path, shared, "second", 8, resume="auto")
    assert f"Restored from {own} (epoch 0, step 3)" in capsys.readouterr().out
    assert trainer.global_step == 8
    assert theirs.read_bytes() == before


def test_a_stop_replaces_its_own_last_ckpt(tmp_path):
    shared = tmp_path / "ckpts"
    with pytest.raises(SystemExit):
        fit(tmp_path, shared, "run", 8, Linear(stop_at=2))
    with pytest.raises(SystemExit):
        fit(tmp_path, shared, "run", 8, Linear(stop_at=5), resume="auto")
    assert sorted(os.listdir(shared)) == ["epoch=0-step=4.ckpt", "last.ckpt"]  # one last file
    assert load(str(shared / "last.ckpt"))["global_step"] == 6


def test_a_stop_keeps_a_file_without_a_run_id(tmp_path):
    shared = tmp_path / "ckpts"
    shared.mkdir()
    (shared / "last.ckpt").write_bytes(b"not a checkpoint")
    with pytest.raises(SystemExit):
        fit(tmp_path, shared, "run", 8, Linear(stop_at=2))
    assert (shared / "last.ckpt").read_bytes() == b"not a checkpoint"
    assert load(str(shared / "last-v1.ckpt"))["global_step"] == 3


# ----- a crafted ModelCheckpoint state ---------------------------------------------------------------------
def _crafted(tmp_path, shared, victims: dict[str, str]) -> str:
    """A genuine checkpoint of a run in `shared` whose ModelCheckpoint state names the victims."""
    trainer = fit(tmp_path, shared, "donor", 4, checkpoint=_topk(shared))
    ckpt = torch.load(trainer.checkpoint_callback.last_model_path, weights_only=True)
    (key,) = [k for k in ckpt["callbacks"] if k.startswith("ModelCheckpoint")]
    state = ckpt["callbacks"][key]
    state["best_k_models"] = {victims["topk"]: 99.0}  # the worst: the first save deletes it
    state["kth_best_model_path"], state["kth_value"] = victims["topk"], 99.0
    state["best_model_path"], state["best_model_score"] = victims["best"], 99.0
    state["last_model_path"] = victims["last"]
    state["run_token"] = "attacker"
    for name in os.listdir(shared):  # only the crafted file and the victims remain
        os.remove(shared / name)
    path = str(tmp_path / "downloaded.ckpt")
    torch.save(ckpt, path)
    return path


def _topk(shared) -> ModelCheckpoint:
    return ModelCheckpoint(dirpath=str(shared), monitor="loss", save_top_k=1, save_last=True)


@pytest.mark.parametrize("where", ["outside", "inside", "traversal", "symlinked-parent"])
def test_a_crafted_callback_state_deletes_no_file_it_did_not_write(tmp_path, where):
    shared = tmp_path / "shared"
    outside = tmp_path / "victims"
    outside.mkdir()
    (tmp_path / "link").symlink_to(outside)
    named = {
        "outside": str(outside / "epoch=0-step=4.ckpt"),
        "inside": str(shared / "epoch=0-step=4.ckpt"),  # another run's file in the shared directory
        "traversal": str(shared / ".." / "victims" / "epoch=0-step=4.ckpt"),
        "symlinked-parent": str(shared / ".." / "link" / "epoch=0-step=4.ckpt"),
    }
    last = str(shared / "last.ckpt") if where == "inside" else str(outside / "last.ckpt")
    path = _crafted(tmp_path, shared, {"topk": named[where], "best": named[where], "last": last})
    fit(tmp_path / "other", shared, "other", 4, checkpoint=_topk(shared))  # the victims' owner
    files = {p: open(p, "rb").read() for p in (named[where], last) if os.path.exists(p)}
    if where != "inside":
        for p in (named[where], last):
            with open(p, "wb") as f:
                f.write(b"victim")
            files[p] = b"victim"
    assert len(files) == 2
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = fit(tmp_path, shared, "finetune", 12, checkpoint=_topk(shared), ckpt_path=path)
    for p, content in files.items():
        assert os.path.exists(p) and open(p, "rb").read() == content, p
    assert any("not this run's checkpoints" in str(w.message) for w in caught)
    assert trainer.global_step == 12
    cb = trainer.checkpoint_callback
    assert os.path.dirname(cb.best_model_path) == str(shared) and cb.best_model_path not in files
    assert cb.last_model_path not in files  # its own last file beside the other run's


def test_a_resumed_run_still_replaces_its_own_top_k_and_last(tmp_path):
    """The same run going on (resume into its dirpath) keeps deleting its own files that fall out."""
    shared = tmp_path / "ckpts"
    fit(tmp_path, shared, "run", 4, checkpoint=_topk(shared))
    first = sorted(os.listdir(shared))
    fit(tmp_path, shared, "run", 12, checkpoint=_topk(shared), resume="auto")
    files = sorted(os.listdir(shared))
    assert len(first) == len(files) == 2 and "last.ckpt" in files
