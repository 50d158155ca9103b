"""What a config may build (issue 13): a ``_target_`` is checked against its slot's type before anything is
called, so a config naming os.system, subprocess.run, builtins.exec or subprocess.Popen runs no command;
``--print-config`` builds nothing; the working directory never shadows an installed package."""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
from typing import Any

import pytest
import torch
import yaml
from config_fixtures import BUILT, HERE, base

from tandem_core.errors import ConfigError
from trainer import config as C
from trainer.cli import main
from trainer.config.slots import slot_types

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def commands(marker: str) -> dict[str, dict[str, Any]]:
    """Entries that would create `marker` if they were called (exec cannot take its source by keyword)."""
    return {
        "os.system": {"_target_": "os.system", "command": f"touch {marker}"},
        "subprocess.run": {"_target_": "subprocess.run", "args": ["touch", marker]},
        "builtins.exec": {"_target_": "builtins.exec", "source": f"open({marker!r}, 'w')"},
        "subprocess.Popen": {"_target_": "subprocess.Popen", "args": ["touch", marker]},  # a class
    }


def place(slot: str, entry: dict[str, Any], tmp_path: Any) -> tuple[dict[str, Any], str, str, Any]:
    """A config with `entry` in `slot`; the name the error gives; the entry that holds it and its type."""
    raw = base(tmp_path)
    if slot in ("task", "data"):
        raw[slot] = entry
        return raw, slot, slot, slot_types()[slot]
    if slot in ("callbacks", "logger"):
        raw[slot] = [entry]
        raw["trainer"]["logger"] = True
        return raw, f"{slot}[0]", f"{slot}[0]", slot_types()[slot]
    if slot == "strategy":
        raw["trainer"].update(strategy=entry, devices=1)
        return raw, "trainer.strategy", "trainer.strategy", slot_types()["strategy"]
    # a nested argument of the task: TypedTask.backbone (a Module) or an item of TypedTask.blocks (a list)
    raw["task"] = {"_target_": f"{HERE}.TypedTask", slot: [entry] if slot == "blocks" else entry}
    return raw, f"task.{slot}" + ("[0]" if slot == "blocks" else ""), "task", slot_types()["task"]


SLOTS = ["task", "data", "callbacks", "logger", "strategy", "backbone", "blocks"]
TARGETS = ["os.system", "subprocess.run", "builtins.exec", "subprocess.Popen"]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("slot", SLOTS)
def test_every_slot_refuses_commands_and_runs_none(slot, target, tmp_path):
    marker = str(tmp_path / "marker")
    raw, where, holder, expected = place(slot, commands(marker)[target], tmp_path)
    message = re.escape(f"{where}: _target_ '{target}' is ")
    with pytest.raises(ConfigError, match=message):
        C.resolve(raw)  # the schema (also what --print-config runs)
    with pytest.raises(ConfigError, match=message):
        C.build(raw)
    node = raw["trainer"]["strategy"] if holder == "trainer.strategy" else raw[holder.split("[")[0]]
    node = node[0] if isinstance(node, list) else node
    with pytest.raises(ConfigError, match=message):  # the builder's own check, without the schema's
        C.instantiate(node, holder, expected=expected)
    assert not os.path.exists(marker)


def test_messages_are_one_line_and_say_what_the_slot_takes(tmp_path):
    marker = str(tmp_path / "marker")
    for target, entry in commands(marker).items():
        with pytest.raises(ConfigError) as info:
            C.resolve({**base(), "task": entry})
        text = str(info.value)
        assert "\n" not in text and target in text and "trainer.Task" in text, text
    with pytest.raises(
        ConfigError, match=r"task: _target_ 'os.system' is a builtin function, not a subclass "
    ):
        C.resolve({**base(), "task": commands(marker)["os.system"]})
    assert not os.path.exists(marker)


def test_nested_entries_build_what_their_parameter_annotation_takes(tmp_path):
    node = {
        "_target_": f"{HERE}.TypedTask",
        "backbone": {"_target_": "torch.nn.Linear", "in_features": 2, "out_features": 3},
        "make_opt": {"_target_": "torch.optim.SGD", "_partial_": True, "lr": 0.5},
        "loss_fn": {"_target_": "torch.nn.functional.mse_loss", "_partial_": True},
        "blocks": [{"_target_": "torch.nn.ReLU"}, {"_target_": "torch.nn.Tanh"}],
    }
    task = C.build({**base(), "task": node}).task
    assert isinstance(task.backbone, torch.nn.Linear) and task.backbone.out_features == 3
    assert isinstance(task.make_opt, functools.partial) and task.make_opt.func is torch.optim.SGD
    opt = task.make_opt(task.backbone.parameters())
    assert isinstance(opt, torch.optim.SGD) and opt.defaults["lr"] == 0.5
    x, y = torch.randn(4), torch.randn(4)
    assert torch.equal(task.loss_fn(x, y), torch.nn.functional.mse_loss(x, y))
    assert [type(b) for b in task.blocks] == [torch.nn.ReLU, torch.nn.Tanh]


@pytest.mark.parametrize(
    "key, entry, message",
    [
        # a function fills a Callable parameter only uncalled (_partial_), never called to build the value
        ("loss_fn", {"_target_": "torch.nn.functional.mse_loss"}, r"is a function, .*add _partial_: true"),
        # Callable[..., Optimizer]: a partial of a class that builds no Optimizer
        (
            "make_opt",
            {"_target_": "torch.nn.Linear", "_partial_": True},
            r"passes 'torch.nn.Linear' uncalled",
        ),
        ("make_opt", {"_target_": "os.system", "_partial_": True}, r"passes 'os.system' uncalled"),
        # a Module parameter takes a Module subclass, not any class
        (
            "backbone",
            {"_target_": "torch.optim.SGD", "params": []},
            r"is the class torch.optim.SGD, not a sub",
        ),
        ("backbone", {"_target_": "torch.nn.Linear", "_partial_": True}, r"takes torch.nn.Module"),
    ],
)
def test_nested_entries_that_the_annotation_refuses(key, entry, message):
    with pytest.raises(ConfigError, match=rf"task.{key}: .*{message}"):
        C.resolve({**base(), "task": {"_target_": f"{HERE}.TypedTask", key: entry}})


def test_a_parameter_without_a_type_takes_no_built_object_and_no_partial(tmp_path):
    # TinyTask.head is `Any`: nothing says which classes may be built or passed there, so none is
    with pytest.raises(
        ConfigError, match=r"task.head: _target_ 'torch.nn.Linear' fills a parameter with no type"
    ):
        C.resolve(
            {**base(), "task": {"_target_": f"{HERE}.TinyTask", "head": {"_target_": "torch.nn.Linear"}}}
        )
    for target in ("torch.nn.ReLU", "os.system"):
        partial = {"_target_": target, "_partial_": True}
        with pytest.raises(
            ConfigError, match=rf"task.head: _partial_: true passes '{target}' uncalled into a "
        ):
            C.resolve({**base(), "task": {"_target_": f"{HERE}.TinyTask", "head": partial}})
    with pytest.raises(ConfigError, match=r"task: _partial_: true passes .* but task takes trainer.Task"):
        C.resolve({**base(), "task": {"_target_": f"{HERE}.TinyTask", "_partial_": True}})


# ----- issue 24: a Callable parameter takes only what is known to build what it asks for --------------------
def gadget(marker: str) -> dict[str, Any]:
    """The issue's chain: a standard-library class with __call__ whose constructor calls its argument."""
    return {
        "_target_": "contextlib._GeneratorContextManager",
        "func": {"_target_": "os.system", "_partial_": True},
        "args": [f"touch {marker}"],
        "kwds": {},
    }


def test_the_gadget_runs_a_command_when_built_unchecked(tmp_path):
    """The control: the chain is real (its constructor runs the command), so refusing it matters."""
    import contextlib

    marker = tmp_path / "marker"
    contextlib._GeneratorContextManager(functools.partial(os.system), [f"touch {marker}"], {})
    assert marker.exists()


@pytest.mark.parametrize("key", ["make_opt", "loss_fn"])  # Callable[..., Optimizer] and a bare Callable
def test_a_callable_parameter_refuses_a_class_that_only_defines_call(key, tmp_path):
    marker = str(tmp_path / "marker")
    raw = {**base(tmp_path), "task": {"_target_": f"{HERE}.TypedTask", key: gadget(marker)}}
    message = rf"task.{key}: _target_ 'contextlib._GeneratorContextManager' is the class .* not known to give"
    with pytest.raises(ConfigError, match=message):
        C.resolve(raw)
    with pytest.raises(ConfigError, match=message):
        C.build(raw)
    with pytest.raises(ConfigError, match=message):  # the builder's own check, without the schema's
        C.instantiate(raw["task"], "task", expected=slot_types()["task"])
    assert not os.path.exists(marker)
    cli = main(["fit", "--print-config", f"task={{_target_: {HERE}.TypedTask, {key}: {gadget(marker)}}}"])
    assert cli == 2 and not os.path.exists(marker)


@pytest.mark.parametrize(
    "entry",
    [
        {"_target_": "os.system", "_partial_": True},
        {"_target_": "subprocess.Popen", "_partial_": True},
        {"_target_": "functools.partial", "func": {"_target_": "os.system", "_partial_": True}},
        {"_target_": "operator.methodcaller", "name": "system"},
    ],
    ids=["os.system", "Popen", "partial-class", "methodcaller"],
)
def test_a_bare_callable_takes_only_the_stated_known_callables(entry):
    raw = {**base(), "task": {"_target_": f"{HERE}.TypedTask", "loss_fn": entry}}
    with pytest.raises(ConfigError, match=r"task.loss_fn: .*torch.nn.functional"):
        C.resolve(raw)


def test_callable_parameters_take_what_is_known_to_build_their_kind():
    node = {
        "_target_": f"{HERE}.TypedTask",
        "make_opt": {"_target_": f"{HERE}.SGDFactory", "lr": 0.25},  # __call__ annotated -> Optimizer
        "loss_fn": {"_target_": "torch.nn.MSELoss"},  # a Module: a known callable
    }
    task = C.build({**base(), "task": node}).task
    opt = task.make_opt(torch.nn.Linear(2, 1).parameters())
    assert isinstance(opt, torch.optim.SGD) and opt.defaults["lr"] == 0.25
    assert isinstance(task.loss_fn, torch.nn.MSELoss)
    bad = {"_target_": f"{HERE}.TypedTask", "make_opt": {"_target_": "torch.nn.MSELoss"}}  # forward -> Tensor
    with pytest.raises(ConfigError, match=r"task.make_opt: .*torch.nn.MSELoss.* not known to give"):
        C.resolve({**base(), "task": bad})


def test_print_config_builds_nothing(tmp_path, capsys):
    BUILT.clear()
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({**base(tmp_path), "task": {"_target_": f"{HERE}.Recorder"}}))
    assert main(["fit", "--config", str(path), "--print-config"]) == 0
    assert f"{HERE}.Recorder" in capsys.readouterr().out and BUILT == []
    marker = str(tmp_path / "marker")
    for target, entry in commands(marker).items():
        assert main(["fit", "--config", str(path), "--print-config", f"task={entry}"]) == 2
        assert target in capsys.readouterr().err
    assert not os.path.exists(marker)
    assert C.build(str(path)).task is not None and BUILT == ["Recorder"]  # the fixture does record


@pytest.mark.parametrize("flags", [["-m", "trainer"], ["-P", "-m", "trainer"]], ids=["python-m", "safe-path"])
def test_a_module_in_the_working_directory_never_shadows_a_package(flags, tmp_path):
    # -m puts the working directory first on sys.path; -P leaves it out, as the `tandem` console script does
    marker = tmp_path / "marker"
    (tmp_path / "omegaconf.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    (tmp_path / "mytask.py").write_text(
        f"from {HERE} import TinyTask\n\n\nclass MyTask(TinyTask):\n    pass\n"
    )
    (tmp_path / "c.yaml").write_text("task: {_target_: mytask.MyTask}\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.path.join(ROOT, "tests")])}
    out = subprocess.run(
        [sys.executable, *flags, "fit", "--config", "c.yaml", "--print-config"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert "_target_: mytask.MyTask" in out.stdout  # the directory's own modules are still found (last)
    assert not marker.exists()
