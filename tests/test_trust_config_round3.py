"""Issue 34 (safe by default, round three), the config side: no config value reaches a command line
(trainer.compile takes only the typed values of trainer/compiler.py's ALLOWED), redaction follows the
resolver (every value oc.env read, in any spelling, is kept out of what the run writes and says), nested
class_path overrides are built or refused as the same entry in a file, and SLURM_JOB_ID is checked."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest
import torch
import yaml
from config_fixtures import HERE as FIXTURES
from config_fixtures import base

from tandem_core.errors import ConfigError, DistributedError
from trainer import Task
from trainer import config as C
from trainer.cli import main

HERE = __name__
SECRET = "sk-live-round3-0123456789abcdef"
# the attack of the issue: inductor passes cpp.march to g++'s command line
PAYLOAD = "native -wrapper '/bin/sh,-c,touch {marker}'"


# ----- 1. no config reaches a command line: trainer.compile ----------------------------------------------
def _write(tmp_path, raw: dict[str, Any]) -> str:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


@pytest.mark.parametrize("form", ["file", "override", "lightning_option"])
def test_compile_options_from_a_config_are_refused_with_the_slot_named(form, tmp_path, capsys):
    marker = tmp_path / "marker"
    payload = PAYLOAD.format(marker=marker)
    raw = base(tmp_path)
    args: list[str] = []
    if form == "file":
        raw["trainer"]["compile"] = {"options": {"cpp.march": payload}}
    elif form == "override":
        args = [f'trainer.compile={{options: {{cpp.march: "{payload}"}}}}']
    else:
        args = [f'--trainer.compile={{options: {{cpp.march: "{payload}"}}}}']
    path = _write(tmp_path, raw)
    with pytest.raises(ConfigError, match=r"trainer\.compile\.options is refused"):
        C.build(path, [a.lstrip("-") for a in args])
    assert main(["fit", "--config", path, *args]) == 2  # a config error, before anything is compiled
    assert "trainer.compile.options is refused" in capsys.readouterr().err
    assert not marker.exists()


@pytest.mark.parametrize(
    "entry, slot",
    [
        ({"backend": "/bin/sh"}, "trainer.compile.backend='/bin/sh'"),  # a backend name is no path
        ({"mode": "max-autotune -o /tmp/x"}, "trainer.compile.mode="),
        ({"fullgraph": "yes"}, "trainer.compile.fullgraph="),  # typed: a bool, not a truthy text
        ({"options": {"cuda.nvcc": "x"}}, "trainer.compile.options is refused"),
        ({"cache_dir": "/tmp"}, "trainer.compile.cache_dir is refused"),
    ],
)
def test_compile_takes_only_typed_values_from_fixed_sets(entry, slot, tmp_path):
    with pytest.raises(ConfigError, match=slot.replace(".", r"\.").replace("(", r"\(")):
        C.build({**base(tmp_path), "trainer": {**base(tmp_path)["trainer"], "compile": entry}})


def test_compile_allow_list_values_build(tmp_path):
    entry = {"mode": "default", "fullgraph": False, "dynamic": None, "backend": "eager", "disable": False}
    run = C.build({**base(tmp_path), "trainer": {**base(tmp_path)["trainer"], "compile": entry}})
    assert run.trainer.compiler.kwargs == entry
    run.trainer.fit(run.task, datamodule=run.datamodule)  # the eager backend compiles and trains
    assert run.trainer.global_step == 2


@pytest.mark.slow
def test_the_compile_payload_is_real(tmp_path):
    """The control: given to torch.compile directly (what trainer.compile passed on before), the payload runs
    its shell command while inductor builds the C++ kernel (about a minute: a fresh compile cache)."""
    marker = tmp_path / "marker"
    script = (
        "import torch\n"
        f"f = torch.compile(lambda x: (x * 2).sin(), options={{'cpp.march': {PAYLOAD.format(marker=marker)!r}}})\n"
        "try:\n    f(torch.randn(8))\nexcept Exception:\n    pass\n"
    )
    env = {
        **os.environ,
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache"),
        "TORCHINDUCTOR_FX_GRAPH_CACHE": "0",
    }
    subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, timeout=600)
    assert marker.exists()


# ----- 2. redaction follows the resolver ------------------------------------------------------------------
class SpellTask(Task):
    def __init__(self, token: str, key_name: str = "API_KEY", width: int = 4) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Linear(width, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = torch.nn.functional.mse_loss(self.net(batch[0]), batch[1])
        self.log("loss", loss)
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


SPELLINGS = [
    "${oc.env:'API_KEY'}",
    '${oc.env:"API_KEY"}',
    "${oc.env:'API_KEY','default'}",
    "${oc.env:${task.key_name}}",
    "${oc.env: API_KEY , 'a-default'}",  # our variant: spaces and a quoted default
    "prefix-${oc.decode:'${oc.env:API_KEY}'}",  # through a second resolver, inside a longer string
]


def _files_holding(root, text: str) -> list[str]:
    found = []
    for folder, _, names in os.walk(root):
        for name in names:
            with open(os.path.join(folder, name), "rb") as f:
                if text.encode() in f.read():
                    found.append(os.path.join(folder, name))
    return found


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_every_spelling_of_an_environment_secret_is_in_no_written_file(
    spelling, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("API_KEY", SECRET)
    runs = tmp_path / "runs"
    raw = base(runs, logger=True, enable_checkpointing=True, log_every_n_steps=1)
    raw["task"] = {"_target_": f"{HERE}.SpellTask", "token": spelling, "key_name": "API_KEY"}
    raw["logger"] = [
        {"_target_": "trainer.loggers.CSVLogger", "save_dir": str(runs), "name": "csv"},
        {"_target_": "trainer.loggers.TensorBoardLogger", "save_dir": str(runs), "name": "tb"},
    ]
    raw["callbacks"] = [
        {"_target_": "callbacks.ModelCheckpoint", "save_last": True, "every_n_train_steps": 1}
    ]
    path = tmp_path / "run.yaml"
    path.write_text(_yaml(raw))
    assert main(["fit", "--config", str(path)]) == 0
    written = [os.path.join(d, n) for d, _, names in os.walk(runs) for n in names]
    assert any(p.endswith(".ckpt") for p in written) and any(p.endswith("hparams.yaml") for p in written)
    assert any(p.endswith("config.yaml") for p in written)
    assert _files_holding(runs, SECRET) == []
    saved = os.path.join(runs, "csv", "version_0", "config.yaml")
    assert SECRET in C.resolve(saved)["task"]["token"]  # read back: from the environment again
    ckpt = torch.load(os.path.join(runs, "csv", "version_0", "checkpoints", "last.ckpt"))
    assert SECRET not in repr(ckpt["hyper_parameters"]) and SECRET not in repr(ckpt["config"])
    capsys.readouterr()
    assert main(["fit", "--config", str(path), "--print-config"]) == 0
    printed = capsys.readouterr().out
    assert SECRET not in printed and "${oc.env:API_KEY" in printed


def _yaml(raw: dict[str, Any]) -> str:
    """YAML with the interpolation text kept as written (safe_dump would quote it differently)."""
    token = raw["task"]["token"]
    raw = {**raw, "task": {**raw["task"], "token": "@TOKEN@"}}
    text = yaml.safe_dump(raw)
    return text.replace("'@TOKEN@'", '"' + token.replace('"', '\\"') + '"').replace("@TOKEN@", token)


def test_a_secret_in_an_error_message_is_redacted(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("API_KEY", SECRET)
    raw = base(tmp_path)
    raw["trainer"]["precision"] = "${oc.env:'API_KEY'}"  # not a precision: the error names the value
    path = _write(tmp_path, raw)
    with pytest.raises(ConfigError) as info:
        C.build(path)
    assert SECRET not in str(info.value) and "${oc.env:API_KEY}" in str(info.value)
    assert main(["fit", "--config", path]) == 2
    err = capsys.readouterr().err
    assert SECRET not in err and "precision" in err


def test_a_users_resolver_that_reads_the_environment_is_redacted_too(monkeypatch):
    from omegaconf import OmegaConf

    from trainer.secrets import env_values

    monkeypatch.setenv("API_KEY", SECRET)
    OmegaConf.register_resolver("test_getenv", lambda name: os.environ[name], replace=True)
    try:
        found = env_values(C.load({"a": "${test_getenv:API_KEY}", "b": "${oc.env:'API_KEY'}"}))
    finally:
        OmegaConf.clear_resolver("test_getenv")
    assert found == {SECRET: "${oc.env:API_KEY}"}


# ----- 6. nested class_path overrides, SLURM_JOB_ID -------------------------------------------------------
def _lightning(tmp_path) -> str:
    raw = base(tmp_path)
    raw.pop("task")
    raw["model"] = {"class_path": f"{FIXTURES}.TypedTask"}
    return _write(tmp_path, raw)


def test_a_nested_class_path_override_is_built_as_in_a_file(tmp_path):
    path = _lightning(tmp_path)
    item = (
        "model.init_args.backbone={class_path: torch.nn.Linear, init_args: {in_features: 2, out_features: 3}}"
    )
    task = C.build(path, [item]).task
    assert isinstance(task.backbone, torch.nn.Linear) and task.backbone.out_features == 3
    # the same through Tandem's own key and a list
    task = C.build(path, ["task.blocks=[{class_path: torch.nn.ReLU}, {class_path: torch.nn.Tanh}]"]).task
    assert [type(b) for b in task.blocks] == [torch.nn.ReLU, torch.nn.Tanh]


@pytest.mark.parametrize("key", ["model.init_args.backbone", "task.backbone", "model.init_args.blocks"])
def test_a_nested_class_path_override_is_refused_as_in_a_file(key, tmp_path):
    marker = tmp_path / "marker"
    entry = f"{{class_path: os.system, init_args: {{command: 'touch {marker}'}}}}"
    value = f"[{entry}]" if key.endswith("blocks") else entry
    with pytest.raises(ConfigError, match=r"_target_ 'os.system' is "):
        C.build(_lightning(tmp_path), [f"{key}={value}"])
    assert not marker.exists()


def test_a_non_digit_slurm_job_id_is_named(monkeypatch):
    from strategies import slurm
    from trainer.plugins.environments import SLURMEnvironment

    monkeypatch.setenv("SLURM_JOB_ID", "12; touch /tmp/x")
    done, said = SLURMEnvironment().requeue()
    assert not done and "SLURM_JOB_ID='12; touch /tmp/x' is not a job number" in said
    monkeypatch.setenv("SLURM_JOB_ID", "abc")
    with pytest.raises(DistributedError, match="SLURM_JOB_ID='abc' is not a SLURM job number"):
        slurm.job_number()
