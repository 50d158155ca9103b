"""Public behaviour that Lightning's own tests (issue 43, the second suite helper's files) found different, each
compared with Lightning on the same script: to_torchscript's deprecation and errors, ..."""

from __future__ import annotations

import os
import warnings
from typing import Any

import pytest
import torch

from trainer import Task

pl = pytest.importorskip("pytorch_lightning")


def _net(base: type) -> Any:
    class Net(base):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 2)

        def forward(self, x):
            return self.layer(x)

    return Net()


def _deprecations(call: Any) -> list[type]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            call()
        except Exception as e:  # the error's kind is compared too
            caught.append(type(e))  # type: ignore[arg-type]
    return [
        w if isinstance(w, type) else w.category
        for w in caught
        if isinstance(w, type) or "torch.jit" not in str(w.message)  # torch's own jit warnings aside
    ]


@pytest.mark.parametrize("call", ["script", "trace", "bad_method", "no_input"])
def test_to_torchscript_is_deprecated_and_refuses_bad_arguments_as_lightning(call):
    """Both warn a DeprecationWarning of their own first (TorchScript is deprecated in torch), then a ValueError
    for a method other than script/trace or a trace without an input; a good call gives the same outputs."""
    seen = {}
    for name, base in (("lightning", pl.LightningModule), ("tandem", Task)):
        torch.manual_seed(0)
        net = _net(base)
        net.example_input_array = None if call == "no_input" else torch.ones(3, 4)
        method = {"bad_method": "temp", "no_input": "trace"}.get(call, call)
        kinds = _deprecations(lambda net=net, method=method: net.to_torchscript(method=method))
        assert issubclass(kinds[0], DeprecationWarning), (name, kinds)
        seen[name] = kinds[1:] and issubclass(kinds[1], ValueError)
        if call in ("script", "trace"):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                out = net.to_torchscript(method=method)(torch.ones(3, 4))
            seen[name] = out.tolist()
    assert seen["lightning"] == seen["tandem"]


OLD_NAMES = [
    ("PrecisionPlugin", (), "Precision"),
    ("DoublePrecisionPlugin", (), "DoublePrecision"),
    ("HalfPrecisionPlugin", (), "HalfPrecision"),
    ("MixedPrecisionPlugin", ("bf16-mixed", "cpu"), "MixedPrecision"),
    ("FSDPPrecisionPlugin", ("bf16-mixed",), "FSDPPrecision"),
    ("FSDPMixedPrecisionPlugin", ("bf16-mixed", "cpu"), "FSDPPrecision"),
]


@pytest.mark.parametrize(("old", "args", "new"), OLD_NAMES)
def test_old_precision_plugin_names_warn_and_build_the_new_class_as_lightning(old, args, new):
    """Lightning's pre-2.2 names (its graveyard keeps them) warn a deprecation and build an instance of the new
    class with the same precision; Tandem's names do the same."""
    import pytorch_lightning.plugins as theirs

    import trainer.plugins as ours

    got = {}
    for side, module in (("lightning", theirs), ("tandem", ours)):
        with pytest.warns(DeprecationWarning):
            plugin = getattr(module, old)(*args)
        assert isinstance(plugin, getattr(module, new))
        got[side] = getattr(plugin, "precision", None)
    assert got["lightning"] == got["tandem"]


def test_deprecated_strategy_keywords_as_lightning():
    """`DDPStrategy.is_distributed` warns and is True; FSDPStrategy's deprecated `activation_checkpointing` with
    the policy too is a ValueError, alone a deprecation; `timeout=timedelta` is the process group's limit."""
    import datetime

    from pytorch_lightning.strategies import DDPStrategy as TheirDDP
    from pytorch_lightning.strategies import FSDPStrategy as TheirFSDP

    from strategies import DDPStrategy, FSDPStrategy

    for ddp in (TheirDDP, DDPStrategy):
        with pytest.warns(DeprecationWarning):
            assert ddp().is_distributed is True
    for fsdp in (TheirFSDP, FSDPStrategy):
        with pytest.raises(ValueError):
            fsdp(activation_checkpointing=torch.nn.Linear, activation_checkpointing_policy={torch.nn.Linear})
    with pytest.warns(DeprecationWarning):
        ours = FSDPStrategy(activation_checkpointing=[torch.nn.Linear])
    assert ours.activation_checkpointing_policy == {torch.nn.Linear}
    limit = datetime.timedelta(seconds=30)
    assert TheirDDP(timeout=limit)._timeout == limit
    assert DDPStrategy(timeout=limit).timeout_s == 30 == FSDPStrategy(timeout=limit).timeout_s


def _stand_in_wandb(monkeypatch: pytest.MonkeyPatch) -> Any:
    """A `wandb` module of mocks (the client is an optional extra): each logger's calls into it are compared."""
    import sys
    import types
    from unittest import mock

    run_kind = type("Run", (), {})
    run = mock.Mock(spec=run_kind, id="r1", config=mock.Mock(), define_metric=mock.Mock(), log=mock.Mock())
    run.log_artifact, run.use_artifact = mock.Mock(), mock.Mock()
    run.name = "run"
    module = types.ModuleType("wandb")
    for name in ("Api", "Artifact", "Image", "Audio", "Video", "Table", "require", "watch"):
        setattr(module, name, mock.Mock())
    module.init = mock.Mock(return_value=run)
    module.run = None
    for sub, attrs in (
        ("wandb.sdk", {}),
        ("wandb.sdk.lib", {"RunDisabled": run_kind}),
        ("wandb.wandb_run", {"Run": run_kind}),
    ):
        part = types.ModuleType(sub)
        for k, v in attrs.items():
            setattr(part, k, v)
        monkeypatch.setitem(sys.modules, sub, part)
    monkeypatch.setitem(sys.modules, "wandb", module)
    return module


def test_wandb_logger_calls_and_checkpoint_metadata_as_lightning(monkeypatch, tmp_path):
    """The same fit with WandbLogger(log_model=True) and ModelCheckpoint(monitor="step"): wandb.init's arguments,
    the uploaded artifact's metadata (a step score is an int; Lightning's keys), `trainer.log_dir` (the logger's
    save_dir) and the checkpoint directory; then log_audio/log_video and download_artifact's calls."""
    import pytorch_lightning.loggers.wandb as their_module
    from pytorch_lightning import Trainer as TheirTrainer
    from pytorch_lightning.callbacks import ModelCheckpoint as TheirCheckpoint
    from pytorch_lightning.demos.boring_classes import BoringModel as TheirModel

    from callbacks import ModelCheckpoint
    from trainer import Trainer
    from trainer.demos import BoringModel
    from trainer.loggers import WandbLogger

    monkeypatch.setattr(their_module, "_WANDB_AVAILABLE", True)
    seen = {}
    for side, logger_cls, trainer_cls, ckpt_cls, model_cls in (
        ("lightning", their_module.WandbLogger, TheirTrainer, TheirCheckpoint, TheirModel),
        ("tandem", WandbLogger, Trainer, ModelCheckpoint, BoringModel),
    ):
        wandb = _stand_in_wandb(monkeypatch)
        save_dir = tmp_path / side
        logger = logger_cls(save_dir=str(save_dir), log_model=True, project="p", anonymous=False)
        fit = trainer_cls(
            default_root_dir=str(save_dir), logger=logger, callbacks=[ckpt_cls(monitor="step")], max_epochs=1,
            limit_train_batches=3, limit_val_batches=1, enable_progress_bar=False, enable_model_summary=False,
        )  # fmt: skip
        fit.fit(model_cls())
        (artifact_call,) = wandb.Artifact.call_args_list
        metadata = dict(artifact_call.kwargs["metadata"])
        logger.log_audio("a", ["x.wav"], sample_rate=[16000])
        logger.log_video("v", ["y.mp4"], fps=[4])
        wandb.run = None
        logger_cls.download_artifact("team/p/model:v0", str(tmp_path), "model")
        seen[side] = {
            "init": wandb.init.call_args.kwargs | {"dir": None},
            "score": (metadata.pop("score"), type(artifact_call.kwargs["metadata"]["score"])),
            "metadata": metadata,
            "log_dir_is_save_dir": fit.log_dir == logger.save_dir,
            "ckpt_dir": os.path.relpath(fit.checkpoint_callback.dirpath, save_dir),
            "media": (wandb.Audio.call_args, wandb.Video.call_args),
            "api": wandb.Api.return_value.artifact.call_args,
        }
    assert seen["lightning"] == seen["tandem"]


def test_an_offline_wandb_logger_leaves_the_environment_alone_where_lightning_sets_wandb_mode(monkeypatch):
    """Deliberate difference (loggers/test_wandb.py::test_wandb_pickle): offline, Lightning sets WANDB_MODE=dryrun
    in the process environment, where it stays for every later W&B run of the process (another logger's, one
    meant to be online); Tandem gives wandb.init mode="offline" for its own run only."""
    import pytorch_lightning.loggers.wandb as their_module

    from trainer.loggers import WandbLogger

    monkeypatch.setattr(their_module, "_WANDB_AVAILABLE", True)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    wandb = _stand_in_wandb(monkeypatch)
    assert their_module.WandbLogger(offline=True).experiment is not None
    assert os.environ.pop("WANDB_MODE") == "dryrun"
    wandb.init.reset_mock()
    assert WandbLogger(offline=True).experiment is not None
    assert "WANDB_MODE" not in os.environ and wandb.init.call_args.kwargs["mode"] == "offline"


@pytest.mark.parametrize("strategy", ["ddp", "ddp_spawn", "ddp_find_unused_parameters_true"])
def test_ddp_family_on_mps_is_refused_when_built_as_lightning(monkeypatch, strategy):
    """On a machine with MPS and no CUDA (mocked), a DDP-family strategy with accelerator "mps" (or "auto") is
    a ValueError when the Trainer is built, under both; a one-device run on MPS is accepted by both, also as
    accelerator="gpu"."""
    from pytorch_lightning import Trainer as TheirTrainer

    from trainer import Trainer

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    import lightning_fabric.accelerators.mps as their_mps  # (Lightning asks its own accelerator)

    monkeypatch.setattr(their_mps, "_get_all_available_mps_gpus", lambda: [0])
    monkeypatch.setattr(their_mps.MPSAccelerator, "is_available", lambda *_: True)
    quiet = dict(
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False
    )
    for trainer_cls in (TheirTrainer, Trainer):
        for accelerator in ("mps", "auto"):
            with pytest.raises(ValueError):
                trainer_cls(accelerator=accelerator, strategy=strategy, devices=1, **quiet)
        for accelerator in ("mps", "gpu"):  # Lightning's "gpu" is MPS where MPS is the GPU
            assert trainer_cls(accelerator=accelerator, devices=1, **quiet).strategy.root_device.type == "mps"


def test_a_worker_told_to_start_workers_is_a_runtime_error_as_lightning(monkeypatch, tmp_path):
    """LOCAL_RANK=1 with a cluster environment whose creates_processes_externally is False (a wrong custom
    environment): both refuse to start workers from a worker with a RuntimeError at fit, before any group."""
    from pytorch_lightning import Trainer as TheirTrainer
    from pytorch_lightning.demos.boring_classes import BoringModel as TheirModel
    from pytorch_lightning.plugins.environments import LightningEnvironment as TheirEnvironment

    from trainer import Trainer
    from trainer.demos import BoringModel
    from trainer.plugins.environments import LightningEnvironment

    monkeypatch.setenv("LOCAL_RANK", "1")
    for trainer_cls, environment, model in (
        (TheirTrainer, TheirEnvironment, TheirModel),
        (Trainer, LightningEnvironment, BoringModel),
    ):
        wrong = type("Wrong", (environment,), {"creates_processes_externally": property(lambda self: False)})
        fit = trainer_cls(
            default_root_dir=str(tmp_path), strategy="ddp", accelerator="cpu", devices=2, plugins=[wrong()],
            barebones=True,
        )  # fmt: skip
        with pytest.raises(RuntimeError):
            fit.fit(model())
        assert not torch.distributed.is_initialized()


@pytest.mark.parametrize(("fn", "keyword", "method"), [
    ("fit", "train_dataloaders", "train_dataloader"), ("validate", "dataloaders", "val_dataloader"),
    ("test", "dataloaders", "test_dataloader"), ("predict", "dataloaders", "predict_dataloader"),
])  # fmt: skip
def test_a_stage_without_data_is_a_type_error_as_lightning(tmp_path, fn, keyword, method):
    """No loader given and no *_dataloader() defined, or one that returns None: a TypeError under both (Tandem's
    NoDataError is a TaskError too); RunningStage.dataloader_prefix names the same methods."""
    from pytorch_lightning import Trainer as TheirTrainer
    from pytorch_lightning.demos.boring_classes import BoringModel as TheirModel
    from pytorch_lightning.trainer.states import RunningStage as TheirStage

    from trainer import Trainer
    from trainer.demos import BoringModel
    from trainer.states import RunningStage

    assert [s.dataloader_prefix for s in TheirStage] == [
        RunningStage(s.value).dataloader_prefix for s in TheirStage
    ]
    for trainer_cls, model_cls in ((TheirTrainer, TheirModel), (Trainer, BoringModel)):
        model = model_cls()
        for name in ("train_dataloader", "val_dataloader", "test_dataloader", "predict_dataloader"):
            setattr(model, name, None)
        run = getattr(trainer_cls(default_root_dir=str(tmp_path), fast_dev_run=1, logger=False), fn)
        with pytest.raises(TypeError):
            run(model, **{keyword: None})
        setattr(model, method, lambda: None)
        with pytest.raises(TypeError):
            run(model)


def test_lightning_cli_builds_a_profiler_class_named_on_the_command_line_as_lightning(tmp_path, monkeypatch):
    """`--trainer.profiler=SimpleProfiler --trainer.profiler.filename=...`: both CLIs build that profiler for the
    Trainer (Tandem's Trainer annotates `profiler` with its Profiler class, so jsonargparse resolves the name)."""
    pytest.importorskip("jsonargparse")
    from pytorch_lightning.cli import LightningCLI as TheirCLI
    from pytorch_lightning.demos.boring_classes import BoringModel as TheirModel

    from trainer.cli import LightningCLI
    from trainer.demos import BoringModel

    monkeypatch.chdir(tmp_path)
    args = ["--trainer.profiler=SimpleProfiler", "--trainer.profiler.filename=perf", "--trainer.logger=false"]
    seen = {}
    for name, cli_cls, model in (("lightning", TheirCLI, TheirModel), ("tandem", LightningCLI, BoringModel)):
        cli = cli_cls(model, run=False, args=args, save_config_callback=None)
        profiler = cli.trainer.profiler
        seen[name] = (type(profiler).__name__, profiler.filename)
    assert seen["lightning"] == seen["tandem"] == ("SimpleProfiler", "perf")


def test_two_stateful_callbacks_with_one_state_key_are_a_runtime_error_as_lightning():
    """Both refuse, when the Trainer is built, two callbacks whose states would share one checkpoint key."""
    from pytorch_lightning import Callback as TheirCallback
    from pytorch_lightning import Trainer as TheirTrainer

    from callbacks import Callback
    from trainer import Trainer

    for trainer_cls, base in ((TheirTrainer, TheirCallback), (Trainer, Callback)):
        same = type(
            "Same", (base,), {"state_key": property(lambda self: "k"), "state_dict": lambda self: {"a": 1}}
        )
        with pytest.raises(RuntimeError):
            trainer_cls(callbacks=[same(), same()], logger=False)


def test_callbacks_from_installed_packages_entry_points_are_not_loaded_where_lightning_loads_them(
    monkeypatch,
):
    """Deliberate difference (trainer/connectors/test_callback_connector.py::test_configure_external_callbacks):
    Lightning builds, with every Trainer, the callbacks that any installed package registers under the entry point
    group "lightning.pytorch.callbacks_factory" (code the script never named runs in its process); Tandem loads
    no entry point, so a Trainer's callbacks are the ones the script or its config gives."""
    from unittest import mock

    import lightning_fabric.utilities.registry as their_registry
    from pytorch_lightning import Callback as TheirCallback
    from pytorch_lightning import Trainer as TheirTrainer

    from trainer import Trainer

    point = mock.Mock()
    point.name = "from_a_package"
    point.load.return_value = lambda: [TheirCallback()]
    query = mock.MagicMock(return_value=[point])
    monkeypatch.setattr(their_registry, "entry_points", query)
    quiet = dict(
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, logger=False
    )
    assert len(TheirTrainer(**quiet).callbacks) == 1 and point.load.called
    point.load.reset_mock()
    with mock.patch("importlib.metadata.entry_points", query):
        assert Trainer(**quiet).callbacks == [] and not point.load.called
