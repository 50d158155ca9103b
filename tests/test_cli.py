"""The `tandem` command (trainer/cli.py): every example config trains, mistakes exit cleanly, runs resume."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
from typing import Any

import pytest
import torch
import yaml
from torch.utils.data import DataLoader, TensorDataset

from trainer import DataModule, Task
from trainer import config as C
from trainer.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(ROOT, "examples", "configs")
HERE = __name__
# a few steps: 3 training batches per epoch, one validation batch, no sanity check, nothing printed per step
FAST = [
    "trainer.accelerator=cpu",
    "trainer.max_steps=2",
    "trainer.limit_train_batches=3",
    "trainer.limit_val_batches=1",
    "trainer.num_sanity_val_steps=0",
    "trainer.enable_progress_bar=false",
    "trainer.enable_model_summary=false",
]


def config(name: str) -> str:
    return os.path.join(CONFIGS, name)


def fit(cfg: str, root: Any, *extra: str) -> int:
    return main(["fit", "--config", cfg, *FAST, f"trainer.default_root_dir={root}", *extra])


def last_ckpt(version_dir: str) -> dict[str, Any]:
    return torch.load(os.path.join(version_dir, "checkpoints", "last.ckpt"), weights_only=False)


def check_run(root: Any, steps: int) -> dict[str, Any]:
    """One version directory with config.yaml and a last.ckpt that stores the same config."""
    versions = sorted(glob.glob(os.path.join(str(root), "lightning_logs", "version_*")))
    assert len(versions) == 1, versions  # only global rank 0 writes
    ckpt = last_ckpt(versions[0])
    assert ckpt["global_step"] == steps
    assert ckpt["config"] == C.resolve(os.path.join(versions[0], "config.yaml"))
    return ckpt


def equal_weights(a: dict[str, Any], b: dict[str, Any]) -> bool:
    sa, sb = a["state_dict"], b["state_dict"]
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


# ----- the example configs ---------------------------------------------------------------------------
def test_strategy_configs_differ_only_in_their_strategy_lines():
    strategy_keys = ("strategy:", "devices:", "accumulate_grad_batches:")
    texts = {}
    for name in ("single", "dp", "ddp", "ddp_accumulate"):
        with open(config(f"{name}.yaml")) as f:
            texts[name] = f.read().splitlines()
    ref = texts["single"]
    for name, lines in texts.items():
        assert len(lines) == len(ref), name
        diff = [(a, b) for a, b in zip(ref, lines) if a != b]
        assert all(
            a.strip().startswith(strategy_keys) and b.strip().startswith(strategy_keys) for a, b in diff
        ), diff
        assert C.resolve(config(f"{name}.yaml"))["trainer"]["strategy"] == name


@pytest.mark.parametrize("name", ["single.yaml", "digits.yaml", "dp.yaml"])
def test_example_config_trains_in_process(name, tmp_path, monkeypatch):
    from strategies import STRATEGIES

    if name == "dp.yaml" and "dp" not in STRATEGIES:
        pytest.skip("strategy 'dp' is not registered yet (strategies/data_parallel.py)")
    monkeypatch.setenv("TANDEM_RUNS", str(tmp_path / "from_env"))
    assert fit(config(name), tmp_path) == 0
    check_run(tmp_path, steps=2)
    assert not (tmp_path / "from_env").exists()  # the override beat the ${oc.env:...} default of the file


@pytest.mark.parametrize(
    ("name", "launcher", "extra", "steps"),
    [
        ("ddp.yaml", "python -m trainer", [], 2),
        # 4 micro-batches per optimizer step, the first 3 without all-reduce
        ("ddp_accumulate.yaml", "tandem", ["trainer.max_steps=1", "trainer.limit_train_batches=4"], 1),
    ],
)
def test_ddp_configs_train_two_processes_through_the_command(name, launcher, extra, steps, tmp_path):
    if launcher == "tandem":
        script = shutil.which("tandem", path=os.path.dirname(sys.executable))
        if script is None:
            pytest.skip("the `tandem` console script is not installed (pip install -e .)")
        command = [script]  # a file path in sys.argv[0]: the workers re-run that file
    else:
        command = [sys.executable, "-m", "trainer"]  # the workers re-run `-m trainer`
    args = ["fit", "--config", config(name), *FAST, f"trainer.default_root_dir={tmp_path}", *extra]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([*command, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ckpt = check_run(tmp_path, steps)
    assert ckpt["config"]["trainer"]["devices"] == 2
    assert proc.stdout.count("run directory:") == 1  # rank 0 only


# ----- mistakes: non-zero exit, one line that says what to change, no traceback ------------------------
@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("trainer.max_epoch=3", "did you mean 'max_epochs'?"),
        ("trainer.max_epochs=abc", "trainer.max_epochs: must be an int"),
        ("task._target_=examples.digits.DigitTask", "cannot import 'examples.digits.DigitTask'"),
        ("trainer.strategy=deepspeedd", "(valid: 'auto', 'single'"),
        ("trainer.strategy=deepspeed", "DeepSpeed is not part of Tandem; use strategy='fsdp'"),
    ],
)
def test_config_mistakes_exit_2_with_a_message(override, message, capsys):
    assert main(["fit", "--config", config("single.yaml"), override]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert err.startswith("tandem: error: ")


def test_a_typo_from_the_real_command_line(tmp_path):
    cmd = [sys.executable, "-m", "trainer", "fit", "--config", config("digits.yaml"), "trainer.max_epoch=3"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "did you mean 'max_epochs'?" in proc.stderr and "Traceback" not in proc.stderr


def test_debug_shows_the_traceback():
    from tandem_core.errors import ConfigError

    with pytest.raises(ConfigError, match="did you mean 'max_epochs'"):
        main(["fit", "--config", config("single.yaml"), "--debug", "trainer.max_epoch=3"])


def test_unknown_command_and_missing_config(capsys):
    assert main(["fitt", "--config", config("single.yaml")]) == 2
    assert "did you mean 'fit'?" in capsys.readouterr().err
    assert main(["fit"]) == 2
    assert "needs --config FILE" in capsys.readouterr().err


# ----- print, reproduce, resume ----------------------------------------------------------------------
def test_print_config_shows_the_resolved_config_and_runs_nothing(tmp_path, capsys):
    overrides = ["task.lr=0.5", f"trainer.default_root_dir={tmp_path}/runs"]
    assert main(["fit", "--config", config("digits.yaml"), "--print-config", *overrides]) == 0
    printed = capsys.readouterr().out
    (tmp_path / "printed.yaml").write_text(printed)
    resolved = C.resolve(tmp_path / "printed.yaml")
    assert resolved == C.resolve(config("digits.yaml"), overrides)
    assert resolved["task"]["lr"] == 0.5  # the override won over the file's 0.01
    assert resolved["logger"][0]["save_dir"] == f"{tmp_path}/runs"  # interpolated after the override
    assert not (tmp_path / "runs").exists()


def test_quoted_and_environment_values_are_typed_by_their_option(capsys, monkeypatch):
    monkeypatch.setenv("TANDEM_TEST_STEPS", "7")
    overrides = [
        "trainer.max_epochs='3'",
        "trainer.max_steps=${oc.env:TANDEM_TEST_STEPS}",
        "trainer.limit_val_batches='0.5'",
        "trainer.enable_model_summary='false'",
    ]
    assert main(["fit", "--config", config("single.yaml"), "--print-config", *overrides]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)["trainer"]
    typed = [printed[k] for k in ("max_epochs", "max_steps", "limit_val_batches", "enable_model_summary")]
    assert typed == [3, 7, 0.5, False] and [type(v) for v in typed] == [int, int, float, bool]
    assert main(["fit", "--config", config("single.yaml"), "trainer.max_steps='7.5'"]) == 2
    assert "trainer.max_steps: must be an int >= -1, got '7.5'" in capsys.readouterr().err


def test_saved_config_reproduces_the_run_and_resumes_it(tmp_path):
    """resumed run == uninterrupted run; a run of the saved config == the original run."""
    first = tmp_path / "first"
    assert fit(config("single.yaml"), first) == 0  # 2 steps, stopped inside the first epoch
    run0 = str(first / "lightning_logs" / "version_0")
    saved = os.path.join(run0, "config.yaml")

    assert main(["fit", "--config", saved, "--ckpt-path", "last", "trainer.max_steps=4"]) == 0
    resumed = last_ckpt(str(first / "lightning_logs" / "version_1"))
    whole = tmp_path / "whole"
    assert fit(config("single.yaml"), whole, "trainer.max_steps=4") == 0
    uninterrupted = last_ckpt(str(whole / "lightning_logs" / "version_0"))
    # val/acc (monitored) does not improve at step 4 (no validation since step 3): as in Lightning, last.ckpt
    # is written with a top-k checkpoint only, so both runs' last.ckpt hold step 3
    assert resumed["global_step"] == uninterrupted["global_step"] == 3
    assert equal_weights(resumed, uninterrupted)

    assert main(["fit", "--config", saved]) == 0  # the saved config alone repeats the first run
    again = str(first / "lightning_logs" / "version_2")
    assert equal_weights(last_ckpt(again), last_ckpt(run0))
    with open(os.path.join(again, "config.yaml")) as a, open(saved) as b:
        assert a.read() == b.read()


# ----- validate, test, predict -----------------------------------------------------------------------
class EvalTask(Task):
    def __init__(self, width: int = 3) -> None:
        super().__init__()
        self.net = torch.nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return torch.nn.functional.mse_loss(self(batch[0]), batch[1])

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val/mse", torch.nn.functional.mse_loss(self(batch[0]), batch[1]))

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self.log("test/mse", torch.nn.functional.mse_loss(self(batch[0]), batch[1]))

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self(batch[0])

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class EvalData(DataModule):
    def _loader(self) -> DataLoader:
        g = torch.Generator().manual_seed(0)
        return DataLoader(
            TensorDataset(torch.randn(8, 3, generator=g), torch.randn(8, 1, generator=g)), batch_size=4
        )

    train_dataloader = val_dataloader = test_dataloader = predict_dataloader = _loader


@pytest.mark.parametrize(
    ("command", "expected"), [("validate", "val/mse"), ("test", "test/mse"), ("predict", "2 batches")]
)
def test_evaluation_commands(command, expected, tmp_path, capsys):
    cfg = tmp_path / "eval.yaml"
    cfg.write_text(
        f"task: {{_target_: {HERE}.EvalTask}}\ndata: {{_target_: {HERE}.EvalData}}\n"
        f"trainer: {{logger: false, enable_progress_bar: false, default_root_dir: {tmp_path}}}\n"
    )
    run = C.build(cfg, ["trainer.max_steps=1", "trainer.enable_checkpointing=false"])
    run.trainer.fit(run.task, datamodule=run.datamodule)
    run.trainer.save_checkpoint(str(tmp_path / "w.ckpt"))
    capsys.readouterr()
    assert main([command, "--config", str(cfg), "--ckpt-path", str(tmp_path / "w.ckpt")]) == 0
    assert expected in capsys.readouterr().out
