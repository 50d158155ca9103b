"""trainer/config/__init__.py: loading, merging, overrides, interpolation, the schema's errors, docs/configuration.md.

Building (Trainer, task, data, the written config) is in test_config_build.py; the options themselves
(trainer/options.py) in test_config_options.py.
"""

from __future__ import annotations

import os
import re
from typing import Any

import pytest
import yaml
from config_fixtures import HERE, base
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tandem_core.errors import ConfigError
from trainer import TandemError
from trainer import config as C
from trainer.options import TrainerConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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


def test_text_values_are_typed_by_their_option(monkeypatch, tmp_path):
    """Strings (an environment variable, a quoted YAML value) become the int, float or bool the option
    takes; the saved config holds the typed value."""
    monkeypatch.setenv("TANDEM_TEST_EPOCHS", "3")
    path = tmp_path / "typed.yaml"
    path.write_text(
        "trainer:\n  max_epochs: ${oc.env:TANDEM_TEST_EPOCHS}\n  limit_train_batches: '0.25'\n"
        "  enable_checkpointing: 'False'\n  devices: '2'\n  precision: '16'\n  fast_dev_run: 'true'\n"
        "  default_root_dir: '2024'\n  deterministic: warn\n"
    )
    section = C.resolve(path)["trainer"]
    typed = {k: section[k] for k in yaml.safe_load(path.read_text())["trainer"]}
    expected = {
        "max_epochs": 3,
        "limit_train_batches": 0.25,
        "enable_checkpointing": False,
        "devices": 2,
        "precision": 16,
        "fast_dev_run": True,
        "default_root_dir": "2024",  # a path stays text
        "deterministic": "warn",
    }
    assert typed == expected
    assert {k: type(v) for k, v in typed.items()} == {k: type(v) for k, v in expected.items()}  # 3, not 3.0
    monkeypatch.setenv("TANDEM_TEST_EPOCHS", "three")
    with pytest.raises(ConfigError, match=r"trainer.max_epochs: must be an int >= -1 .*got 'three'"):
        C.resolve(path)


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
        (
            "trainer.devices=two",
            r"trainer.devices: must be an int >= 1, -1, 'auto', a string like '2' or '0,1'",
        ),
        (
            "trainer.strategy=ddpp",
            r"unknown strategy 'ddpp', did you mean 'ddp'\? \(valid: 'auto', 'single'.*'ddp'",
        ),
        ("trainer.precision=17", r"trainer.precision: unknown precision 17 \(valid: '32-true'"),
        ("trainer.accelerator=tpu", r"trainer.accelerator: 'tpu' is not supported by Tandem; use 'cuda'"),
        (
            "task._target_=examples.digits.DigitTask",
            r"cannot import 'examples.digits.DigitTask': 'examples.digits' "
            r"has no 'DigitTask', did you mean 'DigitsTask'\?",
        ),
        ("task._target_=examples.digitz.DigitsTask", r"'examples' has no 'digitz', did you mean 'digits'\?"),
        ("task._target_=nosuchpkg.Task", r"cannot import 'nosuchpkg.Task': there is no module 'nosuchpkg'"),
        ("task._target_=not a path", r"'not a path' is not an import path"),
        ("task._target_=os.sep", r"'os.sep' is a str, not a class or function"),
        ("trainer.callbacks=[1]", r"callbacks\[0\]: expected a mapping with _target_"),  # LightningCLI's form
        ("trainer.logger=3", r"trainer.logger must be true or false"),
        ("callbacks=3", r"callbacks: expected a list of _target_ entries"),
        ("logger=false", r"to turn logging off set trainer.logger: false"),
        ("callbacks=[{monitor: x}]", r"callbacks\[0\]: expected a mapping with _target_"),
        ("seed_everything=-1", r"seed_everything must be an int in \[0, 2\*\*32\)"),
        ("trainer.max_steps=${nope}", r"Interpolation key 'nope' not found \(at trainer.max_steps\)"),
        ("task.lr=???", r"task.lr is required"),
        ("trainer.x=[", r"cannot apply override 'trainer.x=\['"),
        ("no_equals_sign", r"is not key=value"),
        ("trainer.gradient_clip_val=inf", r"trainer.gradient_clip_val: must be a number >= 0 \(finite\)"),
        (
            "trainer.max_time=soon",
            r"trainer.max_time: must be a usable duration: Timer duration must be 'DD:HH:MM:SS'",
        ),
        ("trainer.strategy=3", r"trainer.strategy must be a strategy name or a _target_ entry, got 3"),
    ],
)
def test_mistakes_are_config_errors_that_say_what_to_change(override, pattern):
    with pytest.raises(ConfigError, match=pattern):
        C.resolve(base(), [override])


def test_missing_required_argument_and_a_typo_in_the_file(tmp_path):
    with pytest.raises(ConfigError, match=r"task: .*NeedsN needs 'n'; set them under task"):
        C.resolve({"task": {"_target_": f"{HERE}.NeedsN"}})
    path = tmp_path / "typo.yaml"
    path.write_text("trainer:\n  max_epoch: 3\n")
    with pytest.raises(ConfigError, match="did you mean 'max_epochs'"):
        C.resolve(path)
    with pytest.raises(ConfigError, match="does not exist"):
        C.resolve(tmp_path / "missing.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must hold a mapping of sections"):
        C.resolve(tmp_path / "list.yaml")


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
    defaults = TrainerConfig.defaults()
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
