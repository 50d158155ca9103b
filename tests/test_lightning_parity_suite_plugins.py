"""Public behaviour found by Lightning's suite in issue 43's fourth round (tuner/test_scale_batch_size.py,
plugins/precision/test_half.py, strategies/test_custom_strategy.py, test_cli.py), each compared with Lightning
itself on the same script; and what Tandem does with a checkpoint Lightning wrote (utilities/
test_upgrade_checkpoint.py, a deliberate difference: docs/porting.md)."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import pytest
import torch
from helpers.lightning_pair import pair_trainer as _trainer
from torch.utils.data import DataLoader

pl = pytest.importorskip("pytorch_lightning")
from pytorch_lightning.demos import boring_classes as plb  # noqa: E402

import callbacks as tandem_callbacks  # noqa: E402
from strategies import SingleDeviceStrategy  # noqa: E402
from tandem_core.errors import CheckpointError  # noqa: E402
from trainer import Task, Trainer, Tuner, demos  # noqa: E402


def _boring(lightning: bool) -> type:
    return plb.BoringModel if lightning else demos.BoringModel


def _search(lightning: bool, tmp_path: Any, mode: str) -> tuple[int, int, int]:
    """tuner/test_scale_batch_size.py::test_dataloader_batch_size_updated_on_failure's script, with the failure a
    real out-of-memory message (which both frameworks' is_oom_error recognize) instead of a patch."""

    class Task(_boring(lightning)):  # type: ignore[misc,valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.batch_size = 16

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            if self.batch_size > 100:
                raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
            return super().training_step(batch, batch_idx)

        def train_dataloader(self) -> Any:
            return DataLoader(
                (plb if lightning else demos).RandomDataset(32, 1000), batch_size=self.batch_size
            )

    task = Task()
    task.validation_step = None
    trainer = _trainer(lightning, tmp_path / mode, max_epochs=2)
    tuner = (pl.tuner.Tuner if lightning else Tuner)(trainer)
    found = tuner.scale_batch_size(task, max_trials=10, steps_per_trial=1, init_val=500, mode=mode)
    return found, task.batch_size, trainer.train_dataloader.batch_size


@pytest.mark.parametrize("mode", ["power", "binsearch"])
def test_batch_size_search_after_out_of_memory_as_lightnings(tmp_path, mode, monkeypatch):
    """The size found after the larger sizes ran out of memory, set on the task and on the rebuilt loader. (Both
    collect garbage before each trial: a full collection of this test process takes half a second, skipped.)"""
    import gc

    monkeypatch.setattr(gc, "collect", lambda *args: 0)
    ours, theirs = _search(False, tmp_path / "t", mode), _search(True, tmp_path / "l", mode)
    assert ours == theirs == ((62,) * 3 if mode == "power" else (95,) * 3)


def _eval_list(lightning: bool, tmp_path: Any) -> list[Any]:
    """plugins/precision/test_half.py::test_configure_model's script: `trainer.test(model, [0])` is one loader of
    one batch (a list of numbers is an iterable of batches), and configure_model builds in the precision's dtype."""
    seen: list[Any] = []

    class Model(pl.LightningModule if lightning else Task):  # type: ignore[misc]
        def configure_model(self) -> None:
            self.layer = torch.nn.Linear(1, 3)
            seen.append(("configure_model", self.layer.weight.dtype))

        def test_step(self, batch: Any, batch_idx: int) -> None:
            seen.append(("test_step", batch, batch_idx))

        def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
            seen.append(("validation_step", batch, batch_idx, dataloader_idx))

    task = Model()
    trainer = (pl.Trainer if lightning else Trainer)(barebones=True, precision="bf16-true")
    trainer.test(task, [0])
    seen.append(("test_dataloaders", trainer.test_dataloaders, task.layer.weight.dtype))
    trainer = _trainer(lightning, tmp_path)
    trainer.validate(task, [[1, 2], [3]])  # a list of two loaders (each a list of batches)
    seen.append(("val_dataloaders", trainer.val_dataloaders))
    return seen


def test_a_list_of_numbers_is_one_loader_as_lightnings(tmp_path):
    ours, theirs = _eval_list(False, tmp_path / "t"), _eval_list(True, tmp_path / "l")
    assert ours == theirs
    assert ("test_step", 0, 0) in ours and ("configure_model", torch.bfloat16) in ours


def _restore(lightning: bool, tmp_path: Any, restore_optimizer: bool | None) -> list[Any]:
    """strategies/test_custom_strategy.py's script: Lightning's SingleDeviceStrategy(device) form, and the
    `lightning_restore_optimizer` switch and `load_optimizer_state_dict` hook a strategy may override; what each
    resume restores is recorded (the optimizer's state when training starts again)."""
    calls: list[Any] = []
    single = pl.strategies.SingleDeviceStrategy if lightning else SingleDeviceStrategy

    class Task(_boring(lightning)):  # type: ignore[misc,valid-type]
        def configure_optimizers(self) -> Any:
            return torch.optim.Adam(self.parameters(), lr=0.01)

        def on_train_start(self) -> None:
            calls.append(("optimizer state", len(self.trainer.optimizers[0].state)))

    class Mine(single):  # type: ignore[misc,valid-type]
        @property
        def lightning_restore_optimizer(self) -> bool:
            return bool(restore_optimizer)

        def load_optimizer_state_dict(self, checkpoint: Any) -> None:
            calls.append(("load_optimizer_state_dict", sorted(checkpoint["optimizer_states"][0])))

    path = os.path.join(tmp_path, "model.ckpt")
    first = _trainer(lightning, tmp_path, max_steps=2)
    first.fit(Task())
    first.save_checkpoint(path)
    for strategy in ([Mine(torch.device("cpu"))] if restore_optimizer is not None else []) + ["auto"]:
        trainer = _trainer(lightning, tmp_path, max_steps=3, strategy=strategy, accelerator="cpu")
        trainer.fit(Task(), ckpt_path=path)
        calls.append(("strategy", type(trainer.strategy).__mro__[1 if strategy != "auto" else 0].__name__))
        calls.append(("device", str(trainer.strategy.root_device), trainer.global_step))
    return calls


@pytest.mark.parametrize("restore_optimizer", [True, False])
def test_a_strategy_that_restores_its_own_optimizer_state_as_lightnings(tmp_path, restore_optimizer):
    ours, theirs = (
        _restore(False, tmp_path / "t", restore_optimizer),
        _restore(True, tmp_path / "l", restore_optimizer),
    )
    assert ours == theirs
    # the own hook runs instead of the default restore (nothing restored the Adam state); the default resume does
    own = [("load_optimizer_state_dict", ["param_groups", "state"])] if restore_optimizer else []
    resumed = [("strategy", "SingleDeviceStrategy"), ("device", "cpu", 3)]
    assert ours == [
        ("optimizer state", 0),
        *own,
        ("optimizer state", 0),
        *resumed,
        ("optimizer state", 2),
        *resumed,
    ]


def _cli(lightning: bool, tmp_path: Any, monkeypatch: Any) -> list[str]:
    """test_cli.py::test_lightning_cli_args_cluster_environments: a cluster environment given by class path in
    `--trainer.plugins` (Lightning's class paths, which Tandem's LightningCLI reads as its own classes)."""
    pytest.importorskip("jsonargparse")
    if lightning:
        from pytorch_lightning.cli import LightningCLI
    else:
        from trainer.cli import LightningCLI
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["main.py"])
    out = []
    envs = "pytorch_lightning.plugins.environments"
    for env, extra in (
        ("LightningEnvironment", ["--trainer.strategy=ddp", "--trainer.devices=1"]),
        ("SLURMEnvironment", []),
    ):
        plugins = json.dumps([{"class_path": f"{envs}.{env}"}])
        args = [f"--trainer.plugins={plugins}", "--trainer.accelerator=cpu", "--trainer.logger=false", *extra]
        cli = LightningCLI(_boring(lightning), run=False, save_config_callback=None, args=args)
        strategy = cli.trainer.strategy
        out.append(
            f"{type(strategy).__name__}:{type(getattr(strategy, 'cluster_environment', None)).__name__}"
        )
    return out


def test_a_cluster_environment_in_cli_plugins_as_lightnings(tmp_path, monkeypatch):
    """(A single-device run has no cluster environment to read: Lightning keeps the plugin in a private
    connector, Tandem's strategy has none; the parallel strategy takes it in both.)"""
    ours, theirs = _cli(False, tmp_path, monkeypatch), _cli(True, tmp_path, monkeypatch)
    assert ours[0] == theirs[0] == "DDPStrategy:LightningEnvironment"
    assert ours[1].split(":")[0] == theirs[1].split(":")[0] == "SingleDeviceStrategy"


def test_a_lightning_checkpoint_is_refused_and_its_weights_load_by_hand(tmp_path):
    """Deliberate difference (utilities/test_upgrade_checkpoint.py): Tandem has no `upgrade_checkpoint` command.
    Its checkpoints carry their own format version (no older released Tandem format to migrate), and a file
    Lightning wrote is refused by name, not migrated; its weights load into the same module by hand, and Tandem's
    save_checkpoint then writes a Tandem checkpoint (docs/porting.md)."""
    lightning_file = str(tmp_path / "lightning.ckpt")
    lt = _trainer(True, tmp_path, max_steps=2)
    lt.fit(plb.BoringModel())
    lt.save_checkpoint(lightning_file)
    trainer = _trainer(False, tmp_path, max_steps=3)
    with pytest.raises(CheckpointError, match="no 'tandem_version'.*not written by this Tandem"):
        trainer.fit(demos.BoringModel(), ckpt_path=lightning_file)
    with pytest.raises(CheckpointError, match="no 'tandem_version'"):
        demos.BoringModel.load_from_checkpoint(lightning_file)
    task = demos.BoringModel()
    task.load_state_dict(torch.load(lightning_file, weights_only=True)["state_dict"])
    expected = torch.load(lightning_file, weights_only=True)["state_dict"]
    assert all(torch.equal(v, expected[k]) for k, v in task.state_dict().items())
    trainer = _trainer(False, tmp_path, max_steps=1)
    trainer.fit(task)  # (one more step, then a Tandem checkpoint that Tandem resumes from)
    tandem_file = str(tmp_path / "tandem.ckpt")
    trainer.save_checkpoint(tandem_file)
    resumed = _trainer(False, tmp_path, max_steps=2)
    resumed.fit(demos.BoringModel(), ckpt_path=tandem_file)
    assert resumed.global_step == 2


def _other_rank(lightning: bool, tmp_path: Any) -> list[Any]:
    """loggers/test_all.py::test_logger_initialization's check on rank 1 (of a ddp_spawn run there), with the rank
    set where both frameworks read it: `logger.experiment` is a DummyExperiment whose calls return None, and the
    file loggers write nothing on that rank."""
    if lightning:
        from pytorch_lightning.loggers import CSVLogger, TensorBoardLogger
        from pytorch_lightning.loggers.logger import DummyExperiment
        from pytorch_lightning.utilities.rank_zero import rank_zero_only
    else:
        from tandem_core.rank_zero import rank_zero_only
        from trainer.loggers import CSVLogger, DummyExperiment, TensorBoardLogger
    out: list[Any] = []
    rank_zero_only.rank = 1
    try:
        for cls in (TensorBoardLogger, CSVLogger):
            logger = cls(save_dir=str(tmp_path), name="run", version=0)
            experiment = logger.experiment
            out.append(
                (cls.__name__, isinstance(experiment, DummyExperiment), experiment.something(foo="bar"))
            )
            logger.log_hyperparams({"lr": 0.1})
            logger.log_metrics({"loss": 1.0}, step=0)
            logger.save()
            logger.finalize("success")
    finally:
        rank_zero_only.rank = 0
    out.append(("files", sorted(os.listdir(tmp_path)) if os.path.isdir(tmp_path) else []))
    return out


def test_loggers_on_other_ranks_give_a_dummy_experiment_as_lightnings(tmp_path):
    ours, theirs = _other_rank(False, tmp_path / "t"), _other_rank(True, tmp_path / "l")
    assert ours == theirs == [("TensorBoardLogger", True, None), ("CSVLogger", True, None), ("files", [])]


def _counting(base: type) -> type:
    class Counting(base):  # type: ignore[misc,valid-type]
        """checkpointing/test_model_checkpoint.py::ModelCheckpointTestInvocations: per rank, the torch.save calls
        from training's start and the state_dict calls, written to <dirpath>/counts-<rank>.json at its end."""

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            from unittest.mock import Mock

            self.state_dicts = 0
            torch.save = Mock(wraps=torch.save)

        def state_dict(self) -> None:  # type: ignore[override]
            self.state_dicts += 1
            super().state_dict()  # (and returns None, as the Lightning test's: nothing to load back)

        def on_train_end(self, trainer: Any, pl_module: Any) -> None:
            super().on_train_end(trainer, pl_module)
            counts = [torch.save.call_count, self.state_dicts, bool(self.best_model_path)]
            torch.save = torch.save._mock_wraps
            with open(os.path.join(self.dirpath, f"counts-{trainer.global_rank}.json"), "w") as f:
                json.dump(counts, f)

    return Counting


def _log_in_two(base: type) -> type:
    class LogInTwo(base):  # type: ignore[misc,valid-type]
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            out = super().training_step(batch, batch_idx)
            self.log("early_stop_on", out["loss"])
            return out

    return LogInTwo


def _named(cls: type, name: str) -> type:
    cls.__name__ = cls.__qualname__ = name  # module level: ddp_spawn's workers unpickle them by this name
    return cls


PLCounting = _named(_counting(pl.callbacks.ModelCheckpoint), "PLCounting")
TandemCounting = _named(_counting(tandem_callbacks.ModelCheckpoint), "TandemCounting")
PLLogInTwo = _named(_log_in_two(plb.BoringModel), "PLLogInTwo")
TandemLogInTwo = _named(_log_in_two(demos.BoringModel), "TandemLogInTwo")


def _spawned_saves(lightning: bool, tmp_path: Any) -> list[Any]:
    dirpath = str(tmp_path / "ckpts")
    callback = (PLCounting if lightning else TandemCounting)(
        dirpath=dirpath, monitor="early_stop_on", save_top_k=-1
    )
    trainer = _trainer(lightning, tmp_path, strategy="ddp_spawn", devices=2, max_epochs=4, enable_checkpointing=True,
                       callbacks=[callback], limit_train_batches=4, limit_val_batches=2)  # fmt: skip
    trainer.fit((PLLogInTwo if lightning else TandemLogInTwo)())
    return [json.load(open(os.path.join(dirpath, f"counts-{r}.json"))) for r in (0, 1)]


@pytest.mark.slow
def test_spawned_checkpoints_are_saved_once_per_epoch_on_rank_zero_only_as_lightnings(tmp_path):
    """checkpointing/test_model_checkpoint.py::test_model_checkpoint_no_extraneous_invocations (ddp_spawn x2, 4
    epochs): rank 0 calls torch.save once per checkpoint, rank 1 never (the ranks' states a checkpoint gathers
    travel as bytes, strategies/wire.py), and every rank's callback gives its state at each save. A callback
    whose state_dict returns None is not loaded back (the spawned run's end, as Lightning's resume rule)."""
    ours, theirs = _spawned_saves(False, tmp_path / "t"), _spawned_saves(True, tmp_path / "l")
    assert ours == theirs == [[4, 4, True], [0, 4, True]]
