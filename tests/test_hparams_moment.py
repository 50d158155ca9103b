"""Hyperparameters reach the loggers when a stage starts, as Lightning 2.6 (Trainer._run's _log_hyperparams):
the same calls, with the same content (the task's and the DataModule's hparams merged), at the same moment
among the hooks, compared with Lightning itself; and a run killed mid-fit (SIGKILL) still has them on disk."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from typing import Any

import pytest
import torch
import yaml
from torch.utils.data import DataLoader, TensorDataset

from callbacks import Callback
from trainer import DataModule, Task, Trainer
from trainer.loggers import Logger

pl = pytest.importorskip("pytorch_lightning")

HOOKS = (
    "setup",
    "on_fit_start",
    "on_sanity_check_start",
    "on_train_start",
    "on_validation_start",
    "on_test_start",
    "on_predict_start",
    "on_fit_end",
)
RUN = dict(max_epochs=1, limit_train_batches=2, limit_val_batches=1, num_sanity_val_steps=1,
           enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)  # fmt: skip


def _data() -> DataLoader:
    g = torch.Generator().manual_seed(0)
    return DataLoader(
        TensorDataset(torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g)), batch_size=4
    )


def _classes(lightning: bool) -> tuple[type, type]:
    """The same task and DataModule for both frameworks: a linear regression with two hyperparameters."""
    task_base, dm_base = (pl.LightningModule, pl.LightningDataModule) if lightning else (Task, DataModule)

    class Reg(task_base):  # type: ignore[valid-type,misc]
        def __init__(self, lr: float = 0.1, hidden: int = 8, log: bool = True) -> None:
            super().__init__()
            self.save_hyperparameters(ignore="log", logger=log)
            self.net = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            return torch.nn.functional.mse_loss(self.net(batch[0]), batch[1])

        validation_step = test_step = training_step

        def predict_step(self, batch, batch_idx):
            return self.net(batch[0])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    class Data(dm_base):  # type: ignore[valid-type,misc]
        def __init__(self, log: bool = True, **extra: Any) -> None:
            super().__init__()
            self.save_hyperparameters({"batch_size": 4, **extra}, logger=log)

        def train_dataloader(self):
            return _data()

        val_dataloader = test_dataloader = predict_dataloader = train_dataloader

    return Reg, Data


def _recorder(
    logger_base: type, callback_base: type, lightning: bool, root: str
) -> tuple[Any, Any, list[Any]]:
    calls: list[Any] = []

    def log_hyperparams(self, params, *args, **kwargs):
        calls.append(("log_hyperparams", dict(params)))

    logger_ns: dict[str, Any] = dict(
        log_hyperparams=log_hyperparams, log_metrics=lambda self, m, step=None: None
    )
    if lightning:
        logger_ns.update(name=property(lambda self: "rec"), version=property(lambda self: 0))
    logger = (
        type("Rec", (logger_base,), logger_ns)()
        if lightning
        else type("Rec", (logger_base,), logger_ns)(root)
    )

    def record(hook: str) -> Any:
        return lambda self, *args, **kwargs: calls.append(hook)

    callback = type("Hooks", (callback_base,), {h: record(h) for h in HOOKS})()
    return logger, callback, calls


def _run(lightning: bool, stage: str, tmp_path, task_logger=True, dm_logger=True, dm_extra=None) -> list[Any]:
    logger_cls, callback_cls, trainer_cls = (
        (pl.loggers.Logger, pl.Callback, pl.Trainer) if lightning else (Logger, Callback, Trainer)
    )
    task_cls, dm_cls = _classes(lightning)
    task, dm = task_cls(log=task_logger), dm_cls(log=dm_logger, **(dm_extra or {}))
    root = str(tmp_path / ("lightning" if lightning else "tandem"))
    logger, callback, calls = _recorder(logger_cls, callback_cls, lightning, root)
    extra = dict(accelerator="cpu", devices=1) if lightning else {}
    trainer = trainer_cls(default_root_dir=root, logger=logger, callbacks=[callback],
                          **RUN, **extra)  # fmt: skip
    getattr(trainer, stage)(task, datamodule=dm)
    return calls


@pytest.mark.parametrize("stage", ["fit", "validate", "test", "predict"])
def test_hparams_are_logged_at_lightnings_moment_with_lightnings_content(tmp_path, stage):
    ours, theirs = _run(False, stage, tmp_path), _run(True, stage, tmp_path)
    assert ours == theirs
    assert (
        "log_hyperparams",
        {"lr": 0.1, "hidden": 8, "batch_size": 4},
    ) in ours  # task's, then the DataModule's
    if stage == "fit":  # after on_fit_start, before the sanity check and on_train_start
        assert ours[:4] == ["setup", "on_fit_start", ours[2], "on_sanity_check_start"]
    else:  # before the stage's first hook
        first = {"validate": "on_validation_start"}.get(stage, f"on_{stage}_start")
        assert ours[:3] == ["setup", ours[1], first]
    assert ours.count(ours[2 if stage == "fit" else 1]) == 1


@pytest.mark.parametrize(("task_logger", "dm_logger"), [(True, False), (False, True), (False, False)])
def test_save_hyperparameters_logger_flags_as_lightning(tmp_path, task_logger, dm_logger):
    kw = dict(task_logger=task_logger, dm_logger=dm_logger)
    assert _run(False, "validate", tmp_path, **kw) == _run(True, "validate", tmp_path, **kw)


def test_a_key_the_task_and_datamodule_hold_with_different_values_is_an_error_as_lightning(tmp_path):
    same = _run(False, "validate", tmp_path, dm_extra={"lr": 0.1})  # the same value: merged
    assert ("log_hyperparams", {"lr": 0.1, "hidden": 8, "batch_size": 4}) in same
    with pytest.raises(RuntimeError, match=r"\['lr'\].*different values"):
        _run(False, "validate", tmp_path, dm_extra={"lr": 0.2})
    with pytest.raises(RuntimeError, match=r"\['lr'\].*different values"):
        _run(True, "validate", tmp_path, dm_extra={"lr": 0.2})


KILLED = """
import os, signal, torch
from torch.utils.data import DataLoader, TensorDataset
from callbacks import Callback
from trainer import Task, Trainer
from trainer.loggers import CSVLogger, TensorBoardLogger

class Reg(Task):
    def __init__(self, lr=0.1, hidden=8):
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Linear(4, 1)
    def training_step(self, batch, batch_idx):
        return torch.nn.functional.mse_loss(self.net(batch[0]), batch[1])
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)

class Kill(Callback):
    def on_train_batch_end(self, trainer, task, outputs, batch, batch_idx):
        if trainer.global_step == 2:
            os.kill(os.getpid(), signal.SIGKILL)  # no cleanup, no finalize: as an OOM kill

data = DataLoader(TensorDataset(torch.randn(16, 4), torch.randn(16, 1)), batch_size=2)
loggers = [CSVLogger(ROOT), TensorBoardLogger(ROOT)]
Trainer(max_epochs=5, logger=loggers, callbacks=[Kill()], default_root_dir=ROOT, enable_progress_bar=False,
        enable_model_summary=False, enable_checkpointing=False).fit(Reg(), data)
"""


def test_a_run_killed_mid_fit_has_its_hyperparameters_in_csv_and_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    script = tmp_path / "killed.py"
    script.write_text(f"ROOT = {str(tmp_path)!r}\n" + textwrap.dedent(KILLED))
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    log_dir = tmp_path / "lightning_logs" / "version_0"
    assert yaml.safe_load((log_dir / "hparams.yaml").read_text()) == {"lr": 0.1, "hidden": 8}
    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    content = acc.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    start = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info
    assert {k: v.number_value for k, v in start.hparams.items()} == {"lr": 0.1, "hidden": 8.0}
