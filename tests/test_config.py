"""trainer/config.py: loading, merging, validating and instantiating run configs; docs/configuration.md."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from functools import partial
from typing import Any

import pytest
import torch
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, TensorDataset

from callbacks import Callback
from trainer import DataModule, TandemError, Task, Trainer
from trainer import config as C
from trainer.errors import ConfigError
from trainer.options import TrainerConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HERE = __name__  # the import path of this module, whatever pytest's import mode made it


class TinyTask(Task):
    """A linear regressor: enough to build, fit a few steps and checkpoint."""

    def __init__(self, width: int = 4, lr: float = 0.1, head: Any = None) -> None:
        super().__init__()
        self.save_hyperparameters(ignore="head")
        self.net = torch.nn.Linear(width, 1)
        self.head = head

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


class TinyData(DataModule):
    def __init__(self, n: int = 16, width: int = 4, batch_size: int = 4) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.data = TensorDataset(torch.randn(n, width, generator=g), torch.randn(n, 1, generator=g))
        self.batch_size = batch_size

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.data, batch_size=self.batch_size)


class Counter(Callback):
    def __init__(self, label: str = "c") -> None:
        self.label, self.steps = label, 0

    def on_train_batch_end(self, trainer: Any, task: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.steps += 1


def base(tmp_path: Any = None, **trainer: Any) -> dict[str, Any]:
    quiet = dict(
        logger=False, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False
    )
    root = {"default_root_dir": str(tmp_path)} if tmp_path is not None else {}
    return {
        "seed_everything": 0,
        "trainer": {"accelerator": "cpu", "max_steps": 2, **quiet, **root, **trainer},
        "task": {"_target_": f"{HERE}.TinyTask", "lr": 0.1},
        "data": {"_target_": f"{HERE}.TinyData"},
    }


# ----- loading, merging, overrides ---------------------------------------------------------------
def test_overrides_win_over_files_and_later_files_win(tmp_path):
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text(f"trainer: {{max_epochs: 3, max_steps: 7}}\ntask: {{_target_: {HERE}.TinyTask, lr: 0.5}}\n")
    b.write_text("trainer: {max_epochs: 4}\n")
    cfg = C.resolve([a, b], ["task.lr=0.01", "trainer.precision=bf16-mixed"])
    assert cfg["trainer"]["max_epochs"] == 4  # b over a
    assert cfg["trainer"]["max_steps"] == 7  # mappings merge key by key
    assert cfg["task"]["lr"] == 0.01 and cfg["trainer"]["precision"] == "bf16-mixed"  # overrides over files


def test_resolved_config_has_every_section_option_and_default():
    cfg = C.resolve(base())
    assert list(cfg) == list(C.SECTIONS)
    assert list(cfg["trainer"]) == TrainerConfig.names()
    assert cfg["task"] == {"_target_": f"{HERE}.TinyTask", "width": 4, "lr": 0.1, "head": None}
    assert cfg["callbacks"] == [] and cfg["logger"] == []


def test_interpolation_and_env(monkeypatch, tmp_path):
    monkeypatch.setenv("TANDEM_TEST_ROOT", str(tmp_path))
    raw = base()
    raw["trainer"]["default_root_dir"] = "${oc.env:TANDEM_TEST_ROOT,nowhere}/runs"
    raw["logger"] = [{"_target_": "trainer.loggers.CSVLogger", "save_dir": "${trainer.default_root_dir}"}]
    raw["trainer"]["logger"] = True
    cfg = C.resolve(raw)
    assert cfg["trainer"]["default_root_dir"] == f"{tmp_path}/runs"
    assert cfg["logger"][0]["save_dir"] == f"{tmp_path}/runs"
    monkeypatch.delenv("TANDEM_TEST_ROOT")
    assert C.resolve(raw)["trainer"]["default_root_dir"] == "nowhere/runs"  # the default after the comma


def test_saved_yaml_reads_back_to_the_same_config(tmp_path):
    raw = base(tmp_path)
    raw["trainer"]["default_root_dir"] = str(tmp_path / "literal \\${not_interpolated}")  # an escaped ${
    cfg = C.resolve(raw, ["trainer.max_epochs=2"])
    assert cfg["trainer"]["default_root_dir"].endswith("literal ${not_interpolated}")
    C.save(cfg, tmp_path / "c.yaml")
    assert C.resolve(tmp_path / "c.yaml") == cfg


# ----- the errors the issue asks for ---------------------------------------------------------------
@pytest.mark.parametrize(
    ("override", "pattern"),
    [
        ("trainer.max_epoch=3", r"unknown key 'trainer.max_epoch', did you mean 'max_epochs'\?"),
        ("trainr.max_epochs=3", r"unknown section 'trainr', did you mean 'trainer'\?"),
        ("task.lrr=0.1", r"unknown key 'task.lrr': .*TinyTask has no argument 'lrr', did you mean 'lr'\?"),
        ("trainer.max_epochs=abc", r"trainer.max_epochs: must be an int >= -1 .*got 'abc'"),
        (
            "trainer.enable_checkpointing=flase",
            r"trainer.enable_checkpointing: must be true or false, got 'flase'",
        ),
        ("trainer.devices=two", r"trainer.devices: must be an int >= 1 or 'auto'"),
        (
            "trainer.strategy=ddpp",
            r"unknown strategy 'ddpp', did you mean 'ddp'\? \(valid: 'auto', 'single'.*'ddp'",
        ),
        ("trainer.precision=17", r"trainer.precision: unknown precision 17 \(valid: '32-true'"),
        ("trainer.accelerator=tpu", r"unknown accelerator 'tpu'"),
        (
            "task._target_=examples.digits.DigitTask",
            r"cannot import 'examples.digits.DigitTask': 'examples.digits' "
            r"has no 'DigitTask', did you mean 'DigitsTask'\?",
        ),
        ("task._target_=examples.digitz.DigitsTask", r"'examples' has no 'digitz', did you mean 'digits'\?"),
        ("task._target_=nosuchpkg.Task", r"cannot import 'nosuchpkg.Task': there is no module 'nosuchpkg'"),
        ("task._target_=not a path", r"'not a path' is not an import path"),
        ("task._target_=os.sep", r"'os.sep' is a str, not a class or function"),
        ("trainer.callbacks=[1]", r"list callbacks in the top-level 'callbacks:' section"),
        ("trainer.logger=[]", r"trainer.logger must be true or false"),
        ("callbacks=3", r"callbacks: expected a list of _target_ entries"),
        ("logger=false", r"to turn logging off set trainer.logger: false"),
        ("callbacks=[{monitor: x}]", r"callbacks\[0\]: expected a mapping with _target_"),
        ("seed_everything=-1", r"seed_everything must be an int in \[0, 2\*\*32\)"),
        ("trainer.max_steps=${nope}", r"Interpolation key 'nope' not found \(at trainer.max_steps\)"),
        ("task.lr=???", r"task.lr is required"),
        ("trainer.x=[", r"cannot apply override 'trainer.x=\['"),
        ("no_equals_sign", r"is not key=value"),
    ],
)
def test_mistakes_are_config_errors_that_say_what_to_change(override, pattern):
    with pytest.raises(ConfigError, match=pattern):
        C.resolve(base(), [override])


def test_missing_required_argument_and_a_typo_in_the_file(tmp_path):
    with pytest.raises(ConfigError, match=r"task: .*needs_n needs 'n'; set them under task"):
        C.resolve({"task": {"_target_": f"{HERE}.needs_n"}})
    path = tmp_path / "typo.yaml"
    path.write_text("trainer:\n  max_epoch: 3\n")
    with pytest.raises(ConfigError, match="did you mean 'max_epochs'"):
        C.resolve(path)
    with pytest.raises(ConfigError, match="does not exist"):
        C.resolve(tmp_path / "missing.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must hold a mapping of sections"):
        C.resolve(tmp_path / "list.yaml")


def needs_n(n: int) -> Counter:
    return Counter(str(n))


def test_constructor_failures_name_the_entry():
    with pytest.raises(ConfigError, match=r"task: building .*TinyTask failed: TypeError") as info:
        C.build(base(), ["task.width=abc"])
    assert info.value.__cause__ is not None  # --debug shows the original traceback
    with pytest.raises(
        ConfigError, match=r"callbacks\[0\]: built a TinyData, which is not a callbacks.Callback"
    ):
        C.build(base(), [f"callbacks=[{{_target_: {HERE}.TinyData}}]"])


# ----- instantiation -------------------------------------------------------------------------------
def test_instantiate_nested_partial_and_colon_paths():
    node = C.validate(
        {
            "task": {
                "_target_": f"{HERE}:TinyTask",
                "width": 3,
                "head": {"opt": {"_target_": "torch.optim.SGD", "_partial_": True, "lr": 0.5}, "xs": [1, 2]},
            }
        }
    )["task"]
    task = C.instantiate(node, "task")
    assert isinstance(task, TinyTask) and task.net.in_features == 3
    assert isinstance(task.head["opt"], partial) and task.head["opt"].keywords["lr"] == 0.5
    assert task.head["xs"] == [1, 2]
    assert C.locate("examples.digits:DigitsTask").__name__ == "DigitsTask"


def test_build_and_from_config(tmp_path):
    raw = base(tmp_path, max_steps=3)
    raw["callbacks"] = [{"_target_": f"{HERE}.Counter", "label": "x"}]
    run = C.build(raw)
    assert isinstance(run.task, TinyTask) and isinstance(run.datamodule, TinyData)
    run.trainer.fit(run.task, datamodule=run.datamodule)
    counter = [cb for cb in run.trainer.callbacks if isinstance(cb, Counter)][0]
    assert (counter.label, counter.steps, run.trainer.global_step) == ("x", 3, 3)
    assert run.trainer.resolved_config == run.config

    trainer = Trainer.from_config(raw, ["trainer.max_steps=5"])
    assert isinstance(trainer, Trainer) and trainer.config.max_steps == 5
    assert trainer.resolved_config["trainer"]["max_steps"] == 5
    assert Trainer(logger=False).resolved_config is None  # built from keywords


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
        ).trainer.world_size
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


# ----- property tests: whatever the input, a TandemError with a message or a valid config -------------
KNOWN_KEYS = [
    *C.SECTIONS,
    *(f"trainer.{n}" for n in TrainerConfig.names()),
    "task.lr",
    "task.width",
    "task.head",
    "task._target_",
    "task._partial_",
    "data.n",
    "data._target_",
    "callbacks.0",
    "callbacks.0._target_",
    "callbacks.1.label",
    "logger.0.save_dir",
    "trainer.strategy._target_",
]
TARGETS = [
    f"{HERE}.TinyTask",
    f"{HERE}.Counter",
    "examples.digits.DigitsTask",
    "callbacks.ModelCheckpoint",
    "trainer.loggers.CSVLogger",
    "strategies.ddp.DDPStrategy",
    "torch.optim.SGD",
    "os.sep",
]
name = st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=8)
known = st.sampled_from(KNOWN_KEYS)
keys = st.one_of(  # mostly real keys, so that the values get past the key checks and reach the builders
    known,
    known,
    known,
    st.lists(st.one_of(name, known, st.integers(0, 3).map(str)), min_size=1, max_size=3).map(".".join),
    st.text(max_size=10),
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-2, 5),
    st.floats(0, 1),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=True),
    st.text(max_size=12),
    st.sampled_from(
        [
            "auto",
            "ddp",
            "dp",
            "single",
            "32-true",
            "bf16-mixed",
            "cpu",
            "norm",
            "warn",
            "???",
            "${x}",
            "[",
            "{a: 1}",
            "${oc.env:HOME}",
            "1.5",
            "-1",
            "0",
        ]
    ),
    st.sampled_from(TARGETS).map(lambda t: f"{{_target_: {t}}}"),
    st.builds("nosuchpkg_{}.{}".format, name, name),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(name, inner, max_size=3)),
    max_leaves=6,
)


def _text(v: Any) -> str:
    """`v` as the text after '=' in an override (YAML flow style; strings as they are)."""
    return (
        v if isinstance(v, str) else yaml.safe_dump([v], default_flow_style=True, width=10**6).strip()[1:-1]
    )


def _check_failure(e: BaseException) -> None:
    assert isinstance(e, TandemError), f"{type(e).__name__}: {e}"
    assert str(e).strip(), "an error without a message"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(keys, values), min_size=1, max_size=3))
def test_random_overrides_give_a_valid_config_or_a_tandem_error(tmp_path_factory, pairs):
    overrides = [f"{k}={_text(v)}" for k, v in pairs]
    root = tmp_path_factory.mktemp("prop")
    try:
        cfg = C.resolve(base(root), overrides)
    except Exception as e:
        _check_failure(e)
        return
    assert set(cfg) == set(C.SECTIONS)
    try:  # building may still refuse what only a constructor knows (e.g. strategy='single' with 2 devices)
        C.build(cfg, [f"trainer.default_root_dir={root}"])
    except Exception as e:
        _check_failure(e)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(known, scalars)
def test_one_random_value_for_a_real_key_builds_or_gives_a_tandem_error(tmp_path_factory, key, value):
    root = tmp_path_factory.mktemp("prop")
    try:
        C.build(base(root), [f"{key}={_text(value)}", f"trainer.default_root_dir={root}"])
    except Exception as e:
        _check_failure(e)


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.one_of(st.sampled_from(C.SECTIONS), name), values, max_size=4))
def test_random_documents_give_a_valid_config_or_a_tandem_error(doc):
    try:
        C.resolve(doc)
    except Exception as e:
        _check_failure(e)


# ----- TrainerConfig and docs/configuration.md cannot drift ------------------------------------------
def _doc() -> str:
    with open(os.path.join(ROOT, "docs", "configuration.md")) as f:
        return f.read()


def test_every_trainer_option_is_documented_with_its_default():
    rows = dict(re.findall(r"^\| `(\w+)` \| `([^`]*)` \|", _doc(), flags=re.M))
    defaults = C.trainer_defaults()
    missing = [n for n in defaults if n not in rows]
    assert not missing, (
        f"docs/configuration.md has no row for Trainer option(s) {missing}; add '| `name` | ...' rows"
    )
    stale = [n for n in rows if n not in defaults]
    assert not stale, f"docs/configuration.md documents options that TrainerConfig does not have: {stale}"
    for n, default in defaults.items():
        assert rows[n] == _text(default), (
            f"docs say {n} defaults to {rows[n]!r}; TrainerConfig says {default!r}"
        )


def test_every_section_strategy_and_flag_is_documented():
    from strategies import STRATEGIES

    doc = _doc()
    for section in C.SECTIONS:
        assert f"### `{section}`" in doc, f"section {section!r} is not documented"
    for strategy in STRATEGIES:
        assert f"`{strategy}`" in doc, f"strategy {strategy!r} is not documented"
    from trainer.cli import COMMANDS, _parser

    for action in _parser()._actions:
        for flag in action.option_strings:
            if flag.startswith("--") and "_" not in flag and flag != "--help":
                assert f"`{flag}" in doc, f"flag {flag} is not documented"
    for command in COMMANDS:
        assert f"`{command}`" in doc


def test_import_trainer_does_not_import_omegaconf():
    code = "import sys, trainer.trainer, trainer.options; assert 'omegaconf' not in sys.modules, 'omegaconf imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
