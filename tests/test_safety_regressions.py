"""Issue 24, the six attacks found already resisted, kept that way: each test mounts the attack and asserts
that it does not work. Where a case also has older tests, they are named in its section.

- symlinks planted at every file a run writes (checkpoints, last.ckpt, config.yaml, hparams.yaml,
  metrics.csv): the link is replaced or a new name taken, the file it points at is never written;
- path traversal in checkpoint names (the filename template, a logged key): the file stays in dirpath;
- a disk that fills up during a save (a real write error from the kernel, through RLIMIT_FSIZE): the
  previous checkpoint stays whole, no temporary file is left, the error surfaces;
- NaN in a monitored metric: never the best, never pushes a finite checkpoint out of the top k;
- a second Ctrl-C while the stop checkpoint is being written: the run stops at once, the previous
  last.ckpt stays whole and loadable;
- YAML tags (``!!python/object/apply:os.system``) in a config file or an override: refused, nothing runs.
"""

from __future__ import annotations

import io
import math
import os
import resource
import signal

import pytest
import torch
import torch.nn.functional as F
from conftest import FAST
from torch.utils.data import DataLoader, TensorDataset

from callbacks import ModelCheckpoint
from tandem_core.errors import CheckpointError, ConfigError
from trainer import Task, Trainer
from trainer import config as C
from trainer.checkpoint import load
from trainer.cli import main

HERE = __name__


class Net(Task):
    def __init__(self, values: tuple[float, ...] = (), interrupt_at: int = -1, width: int = 4) -> None:
        super().__init__()
        self.save_hyperparameters()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(4, 1)
        self.register_buffer("pad", torch.zeros(width))  # a larger checkpoint
        self.values, self.interrupt_at = values, interrupt_at

    def training_step(self, batch, batch_idx):
        if self.global_step == self.interrupt_at:
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C
        x, y = batch
        loss = F.mse_loss(self.layer(x), y)
        if self.values:
            self.log("score", self.values[min(self.current_epoch, len(self.values) - 1)], on_epoch=True)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


def loader() -> DataLoader:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(16, 4, generator=g)
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)


def trainer(root, *callbacks, logger=False, **kwargs) -> Trainer:
    options = {**FAST, "enable_checkpointing": True, "logger": logger, "max_epochs": 1, **kwargs}
    return Trainer(**options, callbacks=list(callbacks), default_root_dir=str(root))


# ----- symlinks at every file a run writes (also: tests/test_resume_auto.py, symlinked version_N) ---------
def test_symlinks_planted_at_the_files_a_run_writes_are_never_written_through(tmp_path):
    victims = tmp_path / "victims"
    victims.mkdir()
    run = tmp_path / "runs" / "exp" / "version_0"
    (run / "checkpoints").mkdir(parents=True)
    planted = {
        "metrics.csv": "epoch,loss,step\n",  # a header that matches what the run logs: append bait
        "hparams.yaml": "victim: true\n",
        "config.yaml": "victim: true\n",
        "checkpoints/last.ckpt": "victim",
        "checkpoints/epoch=1-step=8.ckpt": "victim",
    }
    for i, (name, content) in enumerate(planted.items()):
        (victims / f"v{i}").write_text(content)
        os.symlink(victims / f"v{i}", run / name)
    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        f"task: {{_target_: {HERE}.Net}}\n"
        f"trainer: {{default_root_dir: {tmp_path}, max_epochs: 2, accelerator: cpu, log_every_n_steps: 1,"
        " enable_progress_bar: false, enable_model_summary: false}\n"
        f"logger: [{{_target_: trainer.loggers.CSVLogger, save_dir: {tmp_path}/runs, name: exp, version: 0,"
        " flush_logs_every_n_steps: 1}]\n"
        "callbacks: [{_target_: callbacks.ModelCheckpoint, save_last: true, every_n_epochs: 1}]\n"
    )
    built = C.build(cfg)
    built.trainer.fit(built.task, loader())
    for i, content in enumerate(planted.values()):
        assert (victims / f"v{i}").read_text() == content
    assert len(os.listdir(victims)) == len(planted)
    for name in ("metrics.csv", "hparams.yaml", "config.yaml"):  # replaced by the run's own files
        assert not os.path.islink(run / name) and os.path.isfile(run / name)
    assert "loss" in (run / "metrics.csv").read_text()
    ckpts = os.listdir(run / "checkpoints")
    assert any(load(str(run / "checkpoints" / n))["global_step"] == 8 for n in ckpts if n.startswith("last"))


# ----- path traversal in checkpoint names --------------------------------------------------------------
@pytest.mark.parametrize(
    "filename", ["../../escaped-{epoch}", "{epoch}/../../../escaped", "/tmp/escaped-{step}", "{../../score}"]
)
def test_checkpoint_names_cannot_leave_dirpath(tmp_path, filename):
    dirpath = tmp_path / "a" / "b" / "ckpts"

    class Keyed(Net):
        def training_step(self, batch, batch_idx):
            self.log("../../score", 1.0)
            return super().training_step(batch, batch_idx)

    cb = ModelCheckpoint(dirpath=str(dirpath), filename=filename, save_top_k=-1)
    trainer(tmp_path / "root", cb).fit(Keyed(), loader())
    written = [os.path.join(d, n) for d, _, names in os.walk(tmp_path) for n in names]
    assert written and all(os.path.dirname(p) == str(dirpath) for p in written), written
    assert not os.path.exists("/tmp/escaped-4.ckpt")


# ----- a disk that fills up during a save (also: tests/test_checkpoint_io.py, tests/test_fileio.py) ------
@pytest.fixture
def file_size_limit():
    """Set RLIMIT_FSIZE for this process: a write past it fails in the kernel (EFBIG, as ENOSPC would)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an error from write(), not a signal
    yield lambda n: resource.setrlimit(resource.RLIMIT_FSIZE, (n, hard))
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    signal.signal(signal.SIGXFSZ, previous)


def test_a_disk_full_during_a_save_keeps_the_previous_checkpoint(tmp_path, file_size_limit):
    dirpath = tmp_path / "ckpts"
    cb = ModelCheckpoint(dirpath=str(dirpath), save_last=True, every_n_train_steps=1)

    class Filling(Net):
        def on_train_batch_start(self, batch, batch_idx):
            if self.global_step == 2:  # last.ckpt of step 2 is written: the disk is full from now on
                file_size_limit(1024)

    with pytest.raises(CheckpointError, match=r"could not write checkpoint .*step=3.ckpt.*File too large"):
        trainer(tmp_path, cb).fit(Filling(width=1 << 16), loader())
    file_size_limit(resource.RLIM_INFINITY)
    assert load(str(dirpath / "last.ckpt"))["global_step"] == 2  # whole, loadable
    assert not [n for n in os.listdir(dirpath) if n.startswith(".tmp-")]


# ----- NaN in top-k (also: tests/test_monitor.py, the score of NaN) -------------------------------------
@pytest.mark.parametrize("mode", ["min", "max"])
def test_nan_is_never_the_best_and_pushes_nothing_out_of_the_top_k(tmp_path, mode):
    cb = ModelCheckpoint(dirpath=str(tmp_path / "ckpts"), monitor="score", mode=mode, save_top_k=1)
    trainer(tmp_path, cb, max_epochs=3).fit(Net(values=(1.0, math.nan, math.nan)), loader())
    assert os.path.basename(cb.best_model_path) == "epoch=0-step=4.ckpt"
    assert cb.best_model_score.item() == 1.0
    assert os.listdir(tmp_path / "ckpts") == ["epoch=0-step=4.ckpt"]


# ----- a second Ctrl-C during the stop's save --------------------------------------------------------------
def test_a_second_ctrl_c_during_the_stop_save_keeps_the_previous_last_ckpt(tmp_path, monkeypatch):
    dirpath = tmp_path / "ckpts"
    cb = ModelCheckpoint(dirpath=str(dirpath), save_last=True, every_n_train_steps=2)
    real_save = torch.save

    def interrupted_save(obj, f, *args, **kwargs):
        if isinstance(obj, dict) and obj.get("global_step") == 3:  # the stop's checkpoint
            buf = io.BytesIO()
            real_save(obj, buf, *args, **kwargs)
            f.write(buf.getvalue()[: len(buf.getvalue()) // 2])
            os.kill(os.getpid(), signal.SIGINT)  # the second Ctrl-C, half way through the write
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", interrupted_save)
    with pytest.raises(KeyboardInterrupt):
        trainer(tmp_path, cb, max_epochs=3).fit(Net(interrupt_at=2), loader())
    monkeypatch.undo()
    assert load(str(dirpath / "last.ckpt"))["global_step"] == 2
    assert sorted(os.listdir(dirpath)) == ["epoch=0-step=2.ckpt", "last.ckpt"]


# ----- YAML tags (also: tests/test_config_trust.py, for _target_) ----------------------------------------
TAGS = [
    "!!python/object/apply:os.system ['touch {marker}']",
    "!!python/object/new:subprocess.Popen [['touch', '{marker}']]",
    "!!python/name:os.system",
]


@pytest.mark.parametrize("tag", TAGS, ids=["apply", "new", "name"])
def test_yaml_tags_in_a_config_file_are_refused(tmp_path, tag, capsys):
    marker = tmp_path / "pwned"
    cfg = tmp_path / "run.yaml"
    cfg.write_text(f"task:\n  _target_: {HERE}.Net\n  width: {tag.format(marker=marker)}\n")
    with pytest.raises(ConfigError):
        C.resolve(cfg)
    assert main(["fit", "--config", str(cfg), "--print-config"]) == 2
    assert "not valid YAML" in capsys.readouterr().err
    assert not marker.exists()


@pytest.mark.parametrize("tag", TAGS, ids=["apply", "new", "name"])
def test_yaml_tags_in_an_override_are_refused(tmp_path, tag):
    marker = tmp_path / "pwned"
    with pytest.raises(ConfigError):
        C.resolve({"task": {"_target_": f"{HERE}.Net"}}, [f"task.width={tag.format(marker=marker)}"])
    assert not marker.exists()
