"""No code runs from a checkpoint, on any load path: a crafted pickle whose payload would create a marker
file is refused with a CheckpointError that names the global and the opt-in. Genuine checkpoints, with
hyperparameters that are a partial of an optimizer and a class, still resume exactly and rebuild."""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from callbacks import ModelCheckpoint
from tandem_core.errors import CheckpointError
from trainer import DataModule, Task, Trainer
from trainer.cli import main

HERE = __name__
ADAM = functools.partial(torch.optim.Adam, lr=0.01)
FAST = dict(logger=False, enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)


class _Payload:
    """Unpickling this runs os.system: a stand-in for whatever an attacker's file would run."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


class HpTask(Task):
    """A small regression task whose optimizer and a class come in as hyperparameters."""

    def __init__(
        self,
        optimizer: Callable[..., torch.optim.Optimizer] = ADAM,
        kind: type[torch.optim.Optimizer] = torch.optim.SGD,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(3, 8), torch.nn.ReLU(), torch.nn.Dropout(0.3), torch.nn.Linear(8, 1)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.mse_loss(self(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val/mse", F.mse_loss(self(x), y))

    test_step = validation_step

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self(batch[0])

    def configure_optimizers(self) -> Any:
        return self.hparams.optimizer(self.parameters())


def _loader(shuffle: bool = False) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(32, 3, generator=g), torch.randn(32, 1, generator=g))
    return DataLoader(data, batch_size=4, shuffle=shuffle)


@pytest.fixture
def evil(tmp_path) -> tuple[str, str]:
    """(path of a crafted checkpoint, the marker file its payload would create)."""
    marker = str(tmp_path / "PWNED")
    path = str(tmp_path / "evil.ckpt")
    torch.save({"state_dict": {}, "epoch": 0, "global_step": 0, "payload": _Payload(marker)}, path)
    return path, marker


def _refused(e: pytest.ExceptionInfo[CheckpointError] | str, marker: str) -> None:
    text = e if isinstance(e, str) else str(e.value)
    assert "needs 'posix.system' to load" in text, text
    assert "torch.serialization.add_safe_globals([posix.system])" in text and "weights_only=False" in text
    assert not os.path.exists(marker)


def test_the_payload_is_real(evil):
    """The control: an unrestricted torch.load of the same file does run the payload."""
    path, marker = evil
    torch.load(path, weights_only=False)
    assert os.path.exists(marker)


def test_fit_with_ckpt_path_refuses_a_crafted_pickle(tmp_path, evil):
    path, marker = evil
    with pytest.raises(CheckpointError) as e:
        Trainer(max_steps=2, default_root_dir=str(tmp_path), **FAST).fit(HpTask(), _loader(), ckpt_path=path)
    _refused(e, marker)


@pytest.mark.parametrize("stage", ["validate", "test", "predict"])
def test_evaluation_with_ckpt_path_refuses_a_crafted_pickle(tmp_path, evil, stage):
    path, marker = evil
    trainer = Trainer(default_root_dir=str(tmp_path), **FAST)
    with pytest.raises(CheckpointError) as e:
        getattr(trainer, stage)(HpTask(), _loader(), ckpt_path=path)
    _refused(e, marker)


def test_resume_auto_refuses_a_crafted_last_ckpt(tmp_path, evil):
    """An attacker's file where the run's own last.ckpt would be: resume='auto' finds it and refuses it."""
    path, marker = evil
    ckpt_dir = tmp_path / "checkpoints"
    ckpt_dir.mkdir()
    os.replace(path, ckpt_dir / "last.ckpt")
    trainer = Trainer(
        max_steps=2,
        default_root_dir=str(tmp_path),
        resume="auto",
        callbacks=[ModelCheckpoint(dirpath=str(ckpt_dir), save_last=True)],
        **FAST,
    )
    with pytest.raises(CheckpointError) as e:
        trainer.fit(HpTask(), _loader())
    _refused(e, marker)
    assert trainer.global_step == 0  # nothing trained on top of it either


def test_load_from_checkpoint_refuses_a_crafted_pickle(evil):
    path, marker = evil
    with pytest.raises(CheckpointError) as e:
        HpTask.load_from_checkpoint(path)
    _refused(e, marker)


@pytest.mark.parametrize("command", ["fit", "validate"])
def test_cli_ckpt_path_refuses_a_crafted_pickle(tmp_path, evil, capsys, command):
    path, marker = evil
    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        f"task: {{_target_: {HERE}.HpTask}}\ndata: {{_target_: {HERE}.Data}}\n"
        f"trainer: {{logger: false, enable_progress_bar: false, max_steps: 2, default_root_dir: {tmp_path}}}\n"
    )
    assert main([command, "--config", str(cfg), "--ckpt-path", path]) == 1
    err = capsys.readouterr().err
    assert err.startswith("tandem: error: ")
    _refused(err, marker)


class Data(DataModule):
    """The CLI's data (the same loader for every stage)."""

    def train_dataloader(self) -> DataLoader:
        return _loader(shuffle=True)

    val_dataloader = test_dataloader = predict_dataloader = train_dataloader


# ----- genuine checkpoints still work ---------------------------------------------------------------
def _fit(tmp_path, max_steps: int, ckpt_path: str | None = None) -> tuple[HpTask, Trainer]:
    task = HpTask(optimizer=functools.partial(torch.optim.Adam, lr=0.02, betas=(0.8, 0.99)))
    trainer = Trainer(
        max_steps=max_steps, max_epochs=5, default_root_dir=str(tmp_path), enable_checkpointing=False, **FAST
    )
    torch.manual_seed(1)  # the shuffle order
    trainer.fit(task, _loader(shuffle=True), _loader(), ckpt_path=ckpt_path)
    return task, trainer


def test_a_checkpoint_with_a_partial_and_a_class_resumes_bit_identically(tmp_path):
    whole, _ = _fit(tmp_path / "whole", 13)
    _, first = _fit(tmp_path / "first", 5)  # stopped mid-epoch (8 batches an epoch)
    path = str(tmp_path / "mid.ckpt")
    first.save_checkpoint(path)
    resumed, second = _fit(tmp_path / "second", 13, ckpt_path=path)
    assert second.global_step == 13
    for (name, a), b in zip(whole.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name
    assert isinstance(second.optimizers[0], torch.optim.Adam)


def test_load_from_checkpoint_rebuilds_the_partial_and_the_class(tmp_path):
    trained, trainer = _fit(tmp_path, 3)
    path = str(tmp_path / "w.ckpt")
    trainer.save_checkpoint(path)
    task = HpTask.load_from_checkpoint(path)
    for a, b in zip(trained.state_dict().values(), task.state_dict().values()):
        assert torch.equal(a, b)
    opt = task.hparams.optimizer(task.parameters())  # the partial, rebuilt and usable
    assert isinstance(opt, torch.optim.Adam)
    assert opt.defaults["lr"] == 0.02 and opt.defaults["betas"] == (0.8, 0.99)
    sgd = task.hparams.kind(task.parameters(), lr=0.5)  # the class, callable as before
    assert isinstance(sgd, torch.optim.SGD) and sgd.defaults["lr"] == 0.5
    assert task.configure_optimizers().defaults == opt.defaults


# ----- issue 24: hyperparameters are rebuilt only into what the task's signature declares -------------------
class ActTask(Task):
    """Ordinary code that calls a hyperparameter: `activation` builds the hidden layer's activation."""

    def __init__(self, activation: Any = torch.nn.ReLU) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Linear(3, 1), self.hparams.activation())

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return F.mse_loss(self.net(batch[0]), batch[1])

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class TypedActTask(ActTask):
    def __init__(self, activation: Callable[..., torch.nn.Module] = torch.nn.ReLU) -> None:
        super().__init__(activation)


def _crafted(tmp_path, task: Task, hparams: dict[str, Any]) -> str:
    """A genuine checkpoint of `task` whose stored hyperparameters were replaced (plain data, no pickle)."""
    path = str(tmp_path / "genuine.ckpt")
    trainer = Trainer(max_steps=1, default_root_dir=str(tmp_path), enable_checkpointing=False, **FAST)
    trainer.fit(task, _loader())
    trainer.save_checkpoint(path)
    ckpt = torch.load(path, weights_only=True)
    ckpt["hyper_parameters"] = hparams
    torch.save(ckpt, str(tmp_path / "crafted.ckpt"))
    return str(tmp_path / "crafted.ckpt")


def _spawn(marker: str) -> dict[str, Any]:
    return {"_target_": "os.system", "_partial_": True, "_args_": [f"touch {marker}"]}


@pytest.mark.parametrize("cls", [ActTask, TypedActTask], ids=["Any", "Callable[..., Module]"])
def test_load_from_checkpoint_never_hands_the_task_a_process_spawning_partial(tmp_path, cls):
    marker = str(tmp_path / "PWNED")
    path = _crafted(tmp_path, cls(), {"activation": _spawn(marker)})
    # refused at load time, naming the hyperparameter and both fixes; the task never gets a plain dict
    with pytest.raises(CheckpointError, match=r"hyper_parameters.activation cannot be rebuilt: .*'os.system'.*"
                       r"annotate the parameter.*weights_only=False"):  # fmt: skip
        cls.load_from_checkpoint(path)
    assert not os.path.exists(marker)


def test_nested_arguments_of_a_rebuilt_partial_are_checked_too(tmp_path):
    marker = str(tmp_path / "PWNED")
    hp = {
        "optimizer": {"_target_": "torch.optim.SGD", "_partial_": True, "lr": 0.1, "foreach": _spawn(marker)}
    }
    path = _crafted(tmp_path, HpTask(), hp)
    with pytest.raises(
        CheckpointError, match=r"hyper_parameters.optimizer.foreach cannot be rebuilt: .*'os.system'"
    ):
        HpTask.load_from_checkpoint(path)
    assert not os.path.exists(marker)


def test_a_class_outside_the_declared_type_is_refused_at_load_time(tmp_path):
    path = _crafted(tmp_path, HpTask(), {"kind": {"_target_": "subprocess.Popen", "_partial_": True}})
    with pytest.raises(
        CheckpointError, match=r"hyper_parameters.kind cannot be rebuilt: .*'subprocess.Popen'"
    ):
        HpTask.load_from_checkpoint(path)


def test_declared_hyperparameters_rebuild_without_a_warning(tmp_path):
    path = _crafted(
        tmp_path,
        TypedActTask(torch.nn.Tanh),
        {"activation": {"_target_": "torch.nn.Tanh", "_partial_": True}},
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        task = TypedActTask.load_from_checkpoint(path)
    assert isinstance(task.net[1], torch.nn.Tanh)
