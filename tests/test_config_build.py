"""The config layer builds the run: `_target_` entries, the Trainer (trainer.config.build_trainer), task and
data, the seed, and the config written next to the run's logs and into its checkpoints."""

from __future__ import annotations

import ast
import glob
import os
import subprocess
import sys
from functools import partial
from types import SimpleNamespace

import pytest
import torch
from config_fixtures import HERE, Counter, TinyData, TinyTask, base

from tandem_core.errors import ConfigError
from trainer import Trainer
from trainer import config as C
from trainer.options import TrainerConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_constructor_failures_name_the_entry():
    with pytest.raises(ConfigError, match=r"task: building .*TinyTask failed: TypeError") as info:
        C.build(base(), ["task.width=abc"])
    assert info.value.__cause__ is not None  # --debug shows the original traceback
    with pytest.raises(
        ConfigError,
        match=r"callbacks\[0\]: _target_ '.*TinyData' is the class .*, not a subclass of callbacks.Callback",
    ):
        C.build(base(), [f"callbacks=[{{_target_: {HERE}.TinyData}}]"])


def test_instantiate_nested_partial_and_colon_paths():
    node = C.validate(
        {
            "task": {
                "_target_": f"{HERE}:HeadsTask",
                "width": 3,
                "head": {"opt": {"_target_": "torch.optim.SGD", "_partial_": True, "lr": 0.5}, "xs": [1, 2]},
            }
        }
    )["task"]
    task = C.instantiate(node, "task", expected=TinyTask)
    assert isinstance(task, TinyTask) and task.net.in_features == 3
    assert isinstance(task.head["opt"], partial) and task.head["opt"].keywords["lr"] == 0.5
    assert task.head["xs"] == [1, 2]
    assert C.locate("examples.digits:DigitsTask").__name__ == "DigitsTask"


class LoudTrainer(Trainer):
    """A subclass, to show that build_trainer(cls=...) builds it with the same keywords."""


def test_build_and_build_trainer(tmp_path):
    raw = base(tmp_path, max_steps=3)
    raw["callbacks"] = [{"_target_": f"{HERE}.Counter", "label": "x"}]
    run = C.build(raw)
    assert isinstance(run.task, TinyTask) and isinstance(run.datamodule, TinyData)
    run.trainer.fit(run.task, datamodule=run.datamodule)
    counter = [cb for cb in run.trainer.callbacks if isinstance(cb, Counter)][0]
    assert (counter.label, counter.steps, run.trainer.global_step) == ("x", 3, 3)
    assert run.trainer.resolved_config == run.config
    assert [type(cb) for cb in run.trainer.callbacks].count(C.SaveRunConfig) == 1

    trainer = C.build_trainer(raw, ["trainer.max_steps=5"])
    assert type(trainer) is Trainer and trainer.config.max_steps == 5
    assert trainer.resolved_config["trainer"]["max_steps"] == 5
    assert type(C.build_trainer(raw, cls=LoudTrainer)) is LoudTrainer
    assert Trainer(logger=False).resolved_config is None  # built from keywords
    assert not any(isinstance(cb, C.SaveRunConfig) for cb in Trainer(logger=False).callbacks)


def test_strategy_target_entry_takes_devices_from_the_trainer_section():
    from strategies.ddp import DDPStrategy

    raw = base(devices=2, strategy={"_target_": "strategies.ddp.DDPStrategy", "bucket_cap_mb": 5})
    cfg = C.resolve(raw)
    assert "devices" not in cfg["trainer"]["strategy"]  # comes from trainer.devices, not a filled default
    trainer = C.build(raw, with_task=False).trainer
    assert isinstance(trainer.strategy, DDPStrategy)
    assert (trainer.strategy.devices, trainer.strategy.bucket_cap_mb) == (2, 5)
    with pytest.raises(ConfigError, match=r"trainer.strategy.devices=3 disagrees with trainer.devices=2"):
        C.build(raw, ["trainer.strategy.devices=3"], with_task=False)
    with pytest.raises(ConfigError, match=r"set trainer.devices to a number"):
        C.build(raw, ["trainer.devices=auto"], with_task=False)
    assert (
        C.build(
            raw, ["trainer.devices=auto", "trainer.strategy.devices=2"], with_task=False
        ).trainer.strategy.devices
        == 2
    )


def test_seed_true_is_pinned_so_the_saved_config_repeats_the_run(tmp_path):
    raw = base(tmp_path)
    raw["seed_everything"] = True
    first = C.build(raw)
    seed = first.config["seed_everything"]
    assert isinstance(seed, int) and not isinstance(seed, bool)
    C.save(first.config, tmp_path / "config.yaml")
    again = C.build(tmp_path / "config.yaml")
    assert torch.equal(first.task.net.weight, again.task.net.weight)
    assert C.build(raw, ["seed_everything=false"]).config["seed_everything"] is None


# ----- the config kept with the run ----------------------------------------------------------------
def test_config_is_written_to_the_log_dir_and_stored_in_checkpoints(tmp_path):
    raw = base(tmp_path, logger=True, enable_checkpointing=True)
    ckpt = {
        "_target_": "callbacks.ModelCheckpoint",
        "every_n_train_steps": 1,
        "save_top_k": -1,
        "save_last": True,
    }
    raw["callbacks"] = [ckpt]
    run = C.build(raw)
    run.trainer.fit(run.task, datamodule=run.datamodule)
    saved = os.path.join(run.trainer.log_dir, "config.yaml")
    assert C.resolve(saved) == run.config
    ckpts = [os.path.join(d, f) for d, _, fs in os.walk(tmp_path) for f in fs if f.endswith(".ckpt")]
    assert len(ckpts) == 3  # steps 1 and 2, and last
    for path in ckpts:
        assert torch.load(path, weights_only=False)["config"] == run.config


def test_config_is_written_on_global_rank_zero_only_and_never_under_fast_dev_run(tmp_path):
    cfg = C.resolve(base(tmp_path))
    writer = C.SaveRunConfig(cfg)
    for rank_zero in (False, True):
        fake = SimpleNamespace(
            is_global_zero=rank_zero, config=TrainerConfig(), log_dir=str(tmp_path / f"r{int(rank_zero)}")
        )
        writer.setup(fake, None, "fit")
    assert not (tmp_path / "r0").exists()
    assert C.resolve(tmp_path / "r1" / "config.yaml") == cfg
    assert glob.glob(str(tmp_path / "r1" / ".tmp*")) == []  # written through atomic_write: no leftovers

    run = C.build(base(tmp_path / "dev", logger=True, fast_dev_run=True))
    run.trainer.fit(run.task, datamodule=run.datamodule)
    assert run.trainer.global_step == 1
    assert glob.glob(str(tmp_path / "dev" / "**" / "config.yaml"), recursive=True) == []


# ----- layering: the Trainer never imports the config layer ----------------------------------------
def _imports(path: str) -> set[str]:
    """Every module an `import` anywhere in the file names (``from a import b`` gives a and a.b)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_trainer_loop_strategies_and_callbacks_do_not_import_the_config_layer():
    files = [os.path.join(ROOT, "trainer", name) for name in ("trainer.py", "options.py")]
    for package in (
        "strategies",
        "callbacks",
        os.path.join("trainer", "loop"),
        os.path.join("trainer", "task"),
    ):
        files += glob.glob(os.path.join(ROOT, package, "**", "*.py"), recursive=True)
    names = [n[:-3] for n in os.listdir(os.path.join(ROOT, "trainer", "config")) if n.endswith(".py")]
    config_modules = {"trainer.config"} | {f"trainer.config.{n}" for n in names if n != "__init__"}
    assert {"trainer.config", "trainer.config.build", "trainer.config.save"} <= config_modules
    for path in files:
        bad = sorted(m for m in _imports(path) if m == "trainer.config" or m.startswith("trainer.config."))
        assert not bad, f"{os.path.relpath(path, ROOT)} imports the config layer: {bad}"


def test_importing_either_layer_loads_only_what_it_needs():
    below = (
        "import sys, trainer.trainer, trainer.options\n"
        "assert 'omegaconf' not in sys.modules, 'omegaconf imported'\n"
        "assert not [m for m in sys.modules if m.startswith('trainer.config')], 'config layer imported'\n"
    )
    above = "import sys, trainer.config\nassert 'trainer.trainer' not in sys.modules, 'Trainer imported'\n"
    for code in (below, above):
        subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
