"""LightningCLI (trainer/cli/): Lightning's behaviour where Tandem keeps it (compared with Lightning's own
LightningCLI on the same model and arguments), and its deliberate differences: the trust rules, Lightning's
class paths read as Tandem's, the cli extra, load_from_checkpoint under the checkpoint rules.
(Lightning's own tests/tests_pytorch/test_cli.py runs against it through tools/lightning_suite.)"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any
from unittest import mock

import pytest
import torch
import yaml

from callbacks import EarlyStopping
from tandem_core.errors import CheckpointError, ConfigError, MissingExtraError
from trainer import Trainer
from trainer.cli import LightningCLI, OptimizerCallable, SaveConfigCallback, instantiate_class
from trainer.demos import BoringDataModule, BoringModel
from trainer.loggers import CSVLogger

QUIET = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]


@pytest.fixture(autouse=True)
def _no_command_line(monkeypatch):
    """These tests give LightningCLI its arguments as `args`, with nothing on sys.argv (pytest's own)."""
    monkeypatch.setattr(sys, "argv", ["main.py"])


class Configurable(BoringModel):
    """A model whose arguments take classes and callables (what a config can choose)."""

    def __init__(
        self,
        width: int = 2,
        act: torch.nn.Module | None = None,
        fn: Callable = torch.nn.functional.relu,
        optimizer: OptimizerCallable = torch.optim.SGD,
        anything: Any = None,
        kind: type | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.act, self.fn, self.optimizer, self.anything, self.kind = act, fn, optimizer, anything, kind

    def configure_optimizers(self) -> Any:
        return self.optimizer(self.parameters())


def _pl_configurable() -> type:
    """Configurable, on Lightning."""
    from pytorch_lightning.demos.boring_classes import BoringModel as PLBoringModel

    class PLConfigurable(PLBoringModel):
        def __init__(
            self, width: int = 2, fn: Callable = torch.nn.functional.relu, anything: Any = None
        ) -> None:
            super().__init__()
            self.fn, self.anything = fn, anything

    return PLConfigurable


@pytest.mark.parametrize(
    "arg",
    [
        "--model.fn=os.system",  # a bare Callable: only the known callables
        "--model.fn=builtins.exec",
        "--model.kind=subprocess.Popen",  # a type: a class passed uncalled, to be called later
        '--model.anything={"class_path": "subprocess.Popen", "init_args": {"args": ["touch", "PWNED"]}}',
        '--model.act={"class_path": "subprocess.Popen", "init_args": {"args": ["touch", "PWNED"]}}',
    ],
)
def test_a_config_chooses_no_code_the_trust_rules_refuse(tmp_path, monkeypatch, arg):
    """Where Lightning's LightningCLI takes a function or any class for an untyped, `Any`, `type` or bare
    `Callable` parameter, Tandem's refuses it before anything is built, naming the key."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises((ConfigError, SystemExit)) as caught:
        LightningCLI(Configurable, run=False, args=[arg], save_config_callback=None)
    if caught.type is not SystemExit:  # (jsonargparse's own check refuses Popen for a Module parameter)
        assert f"model.{arg.split('.')[1].split('=')[0]}" in str(caught.value)
    assert not (tmp_path / "PWNED").exists()


def test_lightnings_cli_takes_what_tandems_refuses(tmp_path, monkeypatch):
    """The deliberate difference above, shown on Lightning's own LightningCLI (the same arguments)."""
    from pytorch_lightning.cli import LightningCLI as PLLightningCLI

    monkeypatch.chdir(tmp_path)
    cli = PLLightningCLI(
        _pl_configurable(), run=False, args=["--model.fn=os.system"], save_config_callback=None
    )
    assert cli.model.fn is os.system


def test_known_classes_and_callables_are_taken_and_built(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ["--model.fn=torch.nn.functional.gelu", "--model.optimizer=Adam", "--model.optimizer.lr=0.01"]
    args += ['--model.act={"class_path": "torch.nn.LeakyReLU", "init_args": {"negative_slope": 0.2}}']
    cli = LightningCLI(Configurable, run=False, args=args, save_config_callback=None)
    assert cli.model.fn is torch.nn.functional.gelu and cli.model.act.negative_slope == 0.2
    optimizer = cli.model.configure_optimizers()
    assert isinstance(optimizer, torch.optim.Adam) and optimizer.param_groups[0]["lr"] == 0.01


def test_lightnings_class_paths_in_a_config_name_tandems_classes(tmp_path, monkeypatch):
    """A LightningCLI config keeps Lightning's class paths (lightning.pytorch.* or pytorch_lightning.*)."""
    monkeypatch.chdir(tmp_path)
    config = {
        "trainer": {
            "max_steps": 2,
            "logger": {
                "class_path": "lightning.pytorch.loggers.CSVLogger",
                "init_args": {"save_dir": "logs"},
            },
            "callbacks": [
                {
                    "class_path": "pytorch_lightning.callbacks.EarlyStopping",
                    "init_args": {"monitor": "val_loss"},
                }
            ],
        }
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    cli = LightningCLI(BoringModel, BoringDataModule, run=False, args=["--config=config.yaml", *QUIET])
    assert isinstance(cli.trainer.logger, CSVLogger)
    assert [type(c) for c in cli.trainer.callbacks if isinstance(c, EarlyStopping)] == [EarlyStopping]
    # a string argument that merely spells a Lightning path is data, and stays as written
    assert cli.config.trainer.logger.init_args.save_dir == "logs"


def test_without_jsonargparse_the_error_names_the_extra(monkeypatch):
    monkeypatch.setattr("trainer.cli.parser.AVAILABLE", False)
    with pytest.raises(MissingExtraError, match=r"tandem-trainer\[cli\]"):
        LightningCLI(BoringModel, run=False, args=[])


def test_omegaconf_mode_is_refused_naming_the_tandem_command():
    with pytest.raises(ConfigError, match="tandem fit --config"):
        LightningCLI(BoringModel, run=False, args=[], parser_kwargs={"parser_mode": "omegaconf"})


def test_fit_runs_the_task_with_the_config_and_saves_it_once(tmp_path, monkeypatch):
    """`fit`: the Trainer's fit with the model and data; SaveConfigCallback writes config.yaml once per log
    directory and refuses to write over one (as Lightning), unless overwrite=True."""
    monkeypatch.chdir(tmp_path)
    args = ["fit", "--trainer.max_steps=3", "--trainer.logger=false", "--seed_everything=3", *QUIET]
    cli = LightningCLI(BoringModel, BoringDataModule, args=args)
    assert cli.trainer.global_step == 3 and isinstance(cli.trainer, Trainer)
    saved = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert saved["seed_everything"] == 3 and saved["trainer"]["max_steps"] == 3
    with pytest.raises(RuntimeError, match="Aborting to avoid overwriting"):
        LightningCLI(BoringModel, BoringDataModule, args=args)
    LightningCLI(BoringModel, BoringDataModule, args=args, save_config_kwargs={"overwrite": True})
    rerun = LightningCLI(
        BoringModel, BoringDataModule, args=["fit", "--config=config.yaml", *QUIET], save_config_callback=None
    )
    assert rerun.trainer.global_step == 3
    assert not [c for c in rerun.trainer.callbacks if isinstance(c, SaveConfigCallback)]


class WithActivation(BoringModel):
    def __init__(self, act: torch.nn.Module | None = None, scale: float = 1.0) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.act, self.scale = act, scale


def test_load_from_checkpoint_rebuilds_nested_classes_from_the_saved_config(tmp_path, monkeypatch):
    """As Lightning: the model records the parsed config (with `_instantiator`), so load_from_checkpoint
    rebuilds the LeakyReLU it was given; the checkpoint is read as data throughout."""
    monkeypatch.chdir(tmp_path)
    act = '--model.act={"class_path": "torch.nn.LeakyReLU", "init_args": {"negative_slope": 0.3}}'
    args = ["fit", act, "--model.scale=2.0", "--trainer.max_steps=2", "--trainer.logger=false", *QUIET]
    cli = LightningCLI(WithActivation, BoringDataModule, args=args)
    path = os.path.join(cli.trainer.default_root_dir, "checkpoints", os.listdir("checkpoints")[0])
    ckpt = torch.load(path, weights_only=True)
    assert ckpt["hyper_parameters"]["_instantiator"] == "trainer.cli.instantiate_module"
    assert ckpt["hyper_parameters"]["act"]["class_path"] == "torch.nn.LeakyReLU"
    model = WithActivation.load_from_checkpoint(path)
    assert (
        isinstance(model.act, torch.nn.LeakyReLU) and model.act.negative_slope == 0.3 and model.scale == 2.0
    )
    assert torch.equal(model.layer.weight, cli.model.layer.weight)

    # a checkpoint chooses no code: an instantiator other than LightningCLI's, a class of a module this
    # program has not imported, a class that is not the loaded class's subclass
    def forged(**changes: Any) -> str:
        bad = dict(ckpt, hyper_parameters={**ckpt["hyper_parameters"], **changes})
        out = str(tmp_path / "forged.ckpt")
        torch.save(bad, out)
        return out

    with pytest.raises(CheckpointError, match="not LightningCLI's instantiator"):
        WithActivation.load_from_checkpoint(forged(_instantiator="os.system"))
    with pytest.raises(CheckpointError, match="not imported"):
        WithActivation.load_from_checkpoint(forged(act={"class_path": "tandem_never_imported.Evil"}))
    assert "tandem_never_imported" not in sys.modules
    with pytest.raises(CheckpointError, match="not a subclass"):
        WithActivation.load_from_checkpoint(forged(_class_path="trainer.demos.BoringModel"))


def test_ckpt_path_gives_the_model_its_trained_hyperparameters(tmp_path, monkeypatch):
    """As Lightning: `predict --ckpt_path` builds the model with the hyperparameters it was trained with."""
    monkeypatch.chdir(tmp_path)
    LightningCLI(
        WithActivation, BoringDataModule, args=["fit", "--model.scale=3.0", "--trainer.max_steps=1", *QUIET]
    )
    ckpt = next(p for p in (tmp_path / "lightning_logs").rglob("*.ckpt"))
    cli = LightningCLI(WithActivation, BoringDataModule, args=["predict", f"--ckpt_path={ckpt}", *QUIET])
    assert cli.model.scale == 3.0 and cli.config.predict.model.scale == 3.0


def test_instantiate_class_builds_optimizers_and_schedulers_only():
    params = [torch.nn.Parameter(torch.zeros(2))]
    sgd = instantiate_class(params, {"class_path": "torch.optim.SGD", "init_args": {"lr": 0.5}})
    assert isinstance(sgd, torch.optim.SGD) and sgd.param_groups[0]["lr"] == 0.5
    with pytest.raises(ConfigError, match="not one of the classes"):
        instantiate_class(("true",), {"class_path": "subprocess.Popen"})


def test_the_subcommand_calls_the_trainer_method_with_the_task(tmp_path, monkeypatch):
    """Tandem's Trainer methods take the task as `task` (and `model=`): LightningCLI passes it as `task`."""
    monkeypatch.chdir(tmp_path)
    with mock.patch.object(Trainer, "test", autospec=True) as test:
        cli = LightningCLI(BoringModel, BoringDataModule, args=["test", "--ckpt_path=x", *QUIET])
    test.assert_called_once_with(
        cli.trainer, task=cli.model, datamodule=cli.datamodule, ckpt_path="x", verbose=True, weights_only=None
    )


@pytest.mark.parametrize(
    "trainer",
    [
        {"plugins": [{"class_path": "{pkg}.plugins.DoublePrecision"}]},  # precision's default is not "given"
        {"barebones": True},  # nor enable_checkpointing's (barebones turns it off)
    ],
)
def test_the_trainers_defaults_conflict_with_nothing_as_in_lightnings_cli(tmp_path, monkeypatch, trainer):
    """LightningCLI passes every Trainer option, defaults too: the options whose None means their default are
    None in the signature (Lightning's), so a precision plugin or barebones in a config is taken by both."""
    from pytorch_lightning.cli import LightningCLI as PLLightningCLI
    from pytorch_lightning.demos.boring_classes import BoringModel as PLBoringModel

    monkeypatch.chdir(tmp_path)
    built = {}
    for name, cli, model in (
        ("lightning", PLLightningCLI, PLBoringModel),
        ("tandem", LightningCLI, BoringModel),
    ):
        pkg = "pytorch_lightning" if name == "lightning" else "lightning.pytorch"
        text = yaml.safe_dump({"trainer": {"max_steps": 1, "logger": False, **trainer}}).replace("{pkg}", pkg)
        (tmp_path / "c.yaml").write_text(text)
        made = cli(model, run=False, args=["--config", str(tmp_path / "c.yaml")], save_config_callback=None)
        built[name] = (type(made.trainer.precision_plugin).__name__, made.trainer.checkpoint_callback is None)
    assert built["tandem"] == built["lightning"]
    assert built["tandem"] == (("DoublePrecision", False) if "plugins" in trainer else ("Precision", True))
