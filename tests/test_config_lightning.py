"""LightningCLI configs (trainer/config/lightning_form.py, trainer/config/optim.py): one config built by
Lightning's own LightningCLI (on the Lightning twins of tests/lightning_cli_fixtures.py) and by Tandem gives the
same model, data, optimizer, scheduler, callbacks, logger and Trainer options; the trust rules still hold."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest
import torch
import yaml

from tandem_core.errors import ConfigError
from tests.lightning_cli_fixtures import HERE
from trainer import config as C
from trainer.cli import lightning_options, main

pytest.importorskip("jsonargparse")
from pytorch_lightning.cli import LightningCLI  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True)
def _keep_argv(monkeypatch):
    monkeypatch.setattr(sys, "argv", list(sys.argv))


CONFIG = """\
seed_everything: 7
model:
  class_path: {mod}.{net}
  init_args:
    hidden: 6
    act:
      class_path: torch.nn.LeakyReLU
      init_args: {{negative_slope: 0.2}}
data:
  class_path: {mod}.{data}
  init_args: {{batch_size: 8}}
optimizer:
  class_path: torch.optim.AdamW
  init_args: {{lr: 0.01, weight_decay: 0.05}}
lr_scheduler:
  class_path: StepLR
  init_args: {{step_size: 2, gamma: 0.5}}
trainer:
  max_epochs: 2
  limit_train_batches: 3
  accelerator: cpu
  callbacks:
    - class_path: pytorch_lightning.callbacks.EarlyStopping
      init_args: {{monitor: val/loss, patience: 2}}
    - class_path: ModelCheckpoint
      init_args: {{monitor: val/loss, save_top_k: 2, mode: max}}
    - class_path: pytorch_lightning.callbacks.lr_monitor.LearningRateMonitor
      init_args: {{logging_interval: step}}
  logger:
    class_path: CSVLogger
    init_args: {{save_dir: logs_here, name: exp}}
"""


def write(path: Any, text: str, lightning: bool) -> str:
    names = {"net": "PLNet", "data": "PLData"} if lightning else {"net": "Net", "data": "Data"}
    path.write_text(text.format(mod=HERE, **names))
    return str(path)


def lightning_cli(tmp_path: Any, texts: list[str], args: list[str]) -> LightningCLI:
    files = [write(tmp_path / f"pl{i}.yaml", t, True) for i, t in enumerate(texts)]
    config_args = [a for f in files for a in ("--config", f)]
    sys.argv = sys.argv[:1]  # the args= parameter only, as LightningCLI recommends (restored by the fixture)
    return LightningCLI(run=False, args=[*config_args, *args], save_config_callback=None)


def tandem_run(tmp_path: Any, texts: list[str], args: list[str]) -> C.Run:
    files = [write(tmp_path / f"td{i}.yaml", t, False) for i, t in enumerate(texts)]
    return C.build(files, lightning_options(args)[0])


def same_objects(pl_cli: LightningCLI, run: C.Run) -> None:
    model, task = pl_cli.model, run.task
    recorded = ("_class_path", "_instantiator")  # LightningCLI's notes for reloading; Tandem keeps the config
    assert dict(task.hparams) == {k: v for k, v in model.hparams.items() if k not in recorded}
    for a, b in zip(task.net, model.net):  # the nested class_path entry: same class, same arguments
        assert type(a) is type(b) and getattr(a, "negative_slope", None) == getattr(b, "negative_slope", None)
    assert all(torch.equal(a, b) for a, b in zip(task.state_dict().values(), model.state_dict().values()))
    assert run.datamodule.batch_size == pl_cli.datamodule.batch_size
    ours, theirs = task.configure_optimizers(), model.configure_optimizers()
    (opt,), (sched,) = ours
    (pl_opt,), (pl_sched,) = theirs
    assert type(opt) is type(pl_opt) and type(sched) is type(pl_sched)
    strip = [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
    assert strip == [{k: v for k, v in g.items() if k != "params"} for g in pl_opt.param_groups]
    assert sched.state_dict() == pl_sched.state_dict()
    listed = ("EarlyStopping", "ModelCheckpoint", "LearningRateMonitor")  # the config's; not the defaults
    mine = [c for c in run.trainer.callbacks if type(c).__name__ in listed]
    user = [c for c in pl_cli.trainer.callbacks if type(c).__name__ in listed]
    assert [type(c).__name__ for c in mine] == [type(c).__name__ for c in user]
    for ours_cb, theirs_cb in zip(mine, user):
        for attr in ("monitor", "mode", "patience", "save_top_k", "logging_interval"):
            if hasattr(theirs_cb, attr):
                assert getattr(ours_cb, attr) == getattr(theirs_cb, attr), (type(ours_cb).__name__, attr)
    (logger,), (pl_logger,) = run.trainer.loggers, pl_cli.trainer.loggers
    assert type(logger).__name__ == type(pl_logger).__name__
    assert (logger.save_dir, logger.name) == (pl_logger.save_dir, pl_logger.name)
    for option in ("max_epochs", "limit_train_batches", "max_steps"):
        assert getattr(run.trainer.config, option) == getattr(pl_cli.trainer, option, None) or (
            option == "max_steps" and run.trainer.config.max_steps == pl_cli.trainer.max_steps
        )


def test_tandem_builds_what_lightning_cli_builds(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    same_objects(lightning_cli(tmp_path, [CONFIG], []), tandem_run(tmp_path, [CONFIG], []))


OVERRIDES = [
    ["--trainer.max_epochs=3", "--model.lr=0.5", "--data.batch_size", "2"],
    ["--trainer.max_epochs", "3", "--model.init_args.hidden=3", "--optimizer.lr", "0.2"],
    ["--model.act.negative_slope=0.4", "--lr_scheduler.gamma=0.9", "--seed_everything=3"],
    ["--optimizer=SGD", "--optimizer.lr=0.3", "--optimizer.momentum=0.5", "--trainer.limit_train_batches=2"],
]


@pytest.mark.parametrize("args", OVERRIDES, ids=["equals", "space", "nested", "class"])
def test_overrides_in_both_spellings_agree_with_lightning_cli(args, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    same_objects(lightning_cli(tmp_path, [CONFIG], args), tandem_run(tmp_path, [CONFIG], args))


def test_several_configs_merge_in_order_as_in_lightning_cli(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    second = """\
model:
  init_args: {{lr: 0.25, hidden: 5}}
optimizer: SGD
trainer:
  max_epochs: 4
  callbacks:
    - class_path: pytorch_lightning.callbacks.EarlyStopping
      init_args: {{monitor: val/loss, patience: 9}}
"""
    pl_cli = lightning_cli(tmp_path, [CONFIG, second], [])
    run = tandem_run(tmp_path, [CONFIG, second], [])
    same_objects(pl_cli, run)
    assert run.task.hparams.hidden == 5 and run.trainer.config.max_epochs == 4


def test_plateau_scheduler_returns_lightnings_dict(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    text = CONFIG.replace(
        "class_path: StepLR\n  init_args: {{step_size: 2, gamma: 0.5}}",
        "class_path: ReduceLROnPlateau\n  init_args: {{monitor: val/loss, patience: 4}}",
    )
    theirs = lightning_cli(tmp_path, [text], []).model.configure_optimizers()
    ours = tandem_run(tmp_path, [text], []).task.configure_optimizers()
    assert ours.keys() == theirs.keys() and ours["lr_scheduler"].keys() == theirs["lr_scheduler"].keys()
    assert ours["lr_scheduler"]["monitor"] == theirs["lr_scheduler"]["monitor"] == "val/loss"
    assert ours["lr_scheduler"]["scheduler"].patience == theirs["lr_scheduler"]["scheduler"].patience == 4


def test_optimizer_section_replaces_a_tasks_own_with_lightnings_warning(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    text = CONFIG.replace("{mod}.{net}", "{mod}.NetWithOptimizers")
    with pytest.warns(UserWarning, match=r"NetWithOptimizers.configure_optimizers` will be overridden"):
        run = tandem_run(tmp_path, [text], [])
    assert isinstance(run.task.configure_optimizers()[0][0], torch.optim.AdamW)


def newest(folder: Any) -> dict[str, Any]:
    ckpts = [torch.load(p, weights_only=False) for p in folder.glob("*.ckpt")]
    return max(ckpts, key=lambda c: c["global_step"])


def test_fit_trains_with_the_sections_and_ckpt_path_from_the_config(tmp_path, monkeypatch, capsys):
    """`tandem fit` on the LightningCLI config: the StepLR (step_size 2, gamma 0.5) of the lr_scheduler
    section steps the AdamW of the optimizer section once an epoch; `ckpt_path:` in a second config resumes."""
    monkeypatch.chdir(tmp_path)
    cfg = write(tmp_path / "c.yaml", CONFIG, False)
    fast = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary", "false"]
    assert main(["fit", "--config", cfg, *fast, "--trainer.num_sanity_val_steps", "0"]) == 0
    run0 = tmp_path / "logs_here" / "exp" / "version_0"
    saved = C.resolve(str(run0 / "config.yaml"))
    assert saved["optimizer"]["_target_"] == "torch.optim.AdamW" and saved["ckpt_path"] is None
    ckpt = newest(run0 / "checkpoints")  # epoch 1's: after two epoch steps of StepLR, 0.01 x 0.5
    group = ckpt["optimizer_states"][0]["param_groups"][0]
    assert (group["lr"], group["weight_decay"], ckpt["lr_schedulers"][0]["last_epoch"]) == (0.005, 0.05, 2)
    more = tmp_path / "more.yaml"
    more.write_text(
        f"ckpt_path: {run0 / 'checkpoints' / 'epoch=1-step=6.ckpt'}\ntrainer: {{max_epochs: 3}}\n"
    )
    assert (
        main(["fit", "--config", cfg, "--config", str(more), *fast, "--trainer.num_sanity_val_steps=0"]) == 0
    )
    resumed = newest(tmp_path / "logs_here" / "exp" / "version_1" / "checkpoints")
    assert (resumed["epoch"], resumed["global_step"]) == (2, 9)  # went on from epoch 2: 3 epochs x 3 batches
    assert resumed["lr_schedulers"][0]["last_epoch"] == 3  # the scheduler's state came back too
    capsys.readouterr()
    assert (
        main(["validate", "--config", cfg, "--config", str(more), "--trainer.enable_progress_bar=false"]) == 0
    )
    assert "val/loss" in capsys.readouterr().out  # validate loads the config's ckpt_path too:
    more.write_text(f"ckpt_path: {tmp_path / 'none.ckpt'}\n")
    assert main(["validate", "--config", cfg, "--config", str(more)]) == 1
    assert "none.ckpt" in capsys.readouterr().err


def test_print_config_prints_the_resolved_config_and_exits(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    cfg = write(tmp_path / "c.yaml", CONFIG, False)
    assert main(["fit", "--config", cfg, "--model.lr", "0.3", "--print_config"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["task"]["lr"] == 0.3 and printed["task"]["_target_"] == f"{HERE}.Net"
    assert printed["callbacks"][0]["_target_"] == "callbacks.EarlyStopping"
    assert not (tmp_path / "logs_here").exists()
    assert main(["fit", "--config", cfg, "--print_config=skip_null"]) == 0
    assert "null" not in capsys.readouterr().out


# ----- trust: the rules of docs/configuration.md "Trust" hold for class_path as for _target_ --------------
REFUSED = [
    (
        "model: {class_path: os.system, init_args: {command: touch x}}",
        r"task: _target_ 'os.system' is a builtin function, not a subclass of trainer.Task",
    ),
    (
        "model: {class_path: subprocess.Popen, init_args: {args: [touch, x]}}",
        r"subprocess.Popen, not a subclass",
    ),
    (
        "model: {class_path: NET, init_args: {act: {class_path: subprocess.Popen, init_args: {args: x}}}}",
        r"task.act.*subprocess.Popen.*not a subclass of torch.nn.Module",
    ),
    ("model: NET\noptimizer: {class_path: os.system}", r"optimizer.*'os.system' is not a class"),
    (
        "model: NET\noptimizer: {class_path: subprocess.Popen}",
        r"optimizer: 'subprocess.Popen' is the class Popen, not a subclass of torch.optim.Optimizer",
    ),
    ("model: NET\noptimizer: SGD\nlr_scheduler: {class_path: builtins.exec}", r"lr_scheduler.*not a class"),
    ("model: NET\nlr_scheduler: StepLR", r"lr_scheduler is set but optimizer is not"),
    (
        "model: NET\noptimizer: SGD\nlr_scheduler: torch.optim.lr_scheduler.ReduceLROnPlateau",
        r"does not say which metric",
    ),
    ("model: NET\noptimizer: SGD\nlr_scheduler: ReduceLROnPlateau", r"needs 'monitor'"),
    ("model: {class_path: NET, lr: 0.1}", r"move it to model.init_args.lr"),
    ("model: NET\ntask: NET", r"both 'model'"),
    ("model: Net", r"'Net' is a bare class name; give its import path"),
    ("model: NET\ntrainer: {callbacks: [NoSuchCallback]}", r"callbacks has no class 'NoSuchCallback'"),
    (
        "model: NET\ntrainer: {callbacks: [{class_path: lightning.pytorch.callbacks.NoSuch}]}",
        r"Lightning's; Tandem has no NoSuch in callbacks",
    ),
    ("model: NET\ntrainer: {logger: {class_path: os.system}}", r"logger\[0\].*os.system.*not a subclass"),
    ("model: NET\ntrainer: {callbacks: [EarlyStoping]}", r"did you mean 'EarlyStopping'"),
]


@pytest.mark.parametrize("text, message", REFUSED)
def test_what_a_lightning_cli_config_may_not_do_is_refused_before_anything_runs(
    text, message, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "bad.yaml"
    path.write_text(text.replace("NET", f"{HERE}.Net"))
    with pytest.raises(ConfigError, match=message):
        run = C.build(str(path))
        run.task.configure_optimizers()
    assert not (tmp_path / "x").exists()


def test_command_line_mistakes_say_what_to_write(capsys):
    with pytest.raises(SystemExit):
        main(["fit", "--config", "x.yaml", "--trainer.max_epochs"])
    assert "--trainer.max_epochs=VALUE" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["fit", "--print_config=comments"])
    assert "knows only skip_null" in capsys.readouterr().err


@pytest.mark.parametrize(
    "item, expected",
    [
        ("trainer.max_epochs=3", "trainer.max_epochs=3"),
        ("model.lr=0.1", "task.lr=0.1"),
        ("model.init_args.lr=0.1", "task.lr=0.1"),
        ("model.class_path=my.Net", "task._target_=my.Net"),
        ("model.init_args.act.class_path=torch.nn.ReLU", "task.act._target_=torch.nn.ReLU"),
        ("model=my.Net", ("task", {"_target_": "my.Net"})),
        ("optimizer=Adam", ("optimizer", {"_target_": "torch.optim.Adam"})),
        (
            "lr_scheduler.class_path=ReduceLROnPlateau",
            "lr_scheduler._target_=trainer.config.optim.ReduceLROnPlateau",
        ),
        ("trainer.callbacks.1.init_args.patience=5", "callbacks.1.patience=5"),
        ("trainer.logger.init_args.save_dir=x", "logger.0.save_dir=x"),
        ("trainer.logger=false", "trainer.logger=false"),
        ("trainer.logger=[]", "trainer.logger=false"),
        ("trainer.callbacks=[EarlyStopping]", ("callbacks", [{"_target_": "callbacks.EarlyStopping"}])),
        ("task.lr=0.1", "task.lr=0.1"),
        ("callbacks.0.monitor=x", "callbacks.0.monitor=x"),
    ],
)
def test_lightning_cli_override_names_become_tandems(item, expected):
    from trainer.config.lightning_form import override

    assert override(item) == expected


def test_class_path_override_changes_the_class(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    cfg = write(tmp_path / "c.yaml", CONFIG, False)
    args = ["--model.class_path", f"{HERE}.NetWithOptimizers", "--print_config"]
    assert main(["fit", "--config", cfg, *args]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["task"]["_target_"] == f"{HERE}.NetWithOptimizers"


@pytest.mark.slow
def test_lightning_cli_config_under_ddp_through_the_command(tmp_path):
    """Two processes: each worker re-runs the command line (LightningCLI's --x.y options included) and
    builds the optimizer section's AdamW and StepLR on its own replica; rank 0 writes one run."""
    cfg = write(tmp_path / "c.yaml", CONFIG, False)
    args = ["--trainer.strategy", "ddp", "--trainer.devices=2", "--trainer.num_sanity_val_steps", "0"]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainer",
            "fit",
            "--config",
            cfg,
            *args,
            "--trainer.enable_progress_bar=false",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(p.name for p in (tmp_path / "logs_here" / "exp").iterdir()) == ["version_0"]
    ckpt = newest(tmp_path / "logs_here" / "exp" / "version_0" / "checkpoints")
    assert ckpt["global_step"] == 4  # 32 samples, batches of 8, 2 ranks: 2 steps an epoch, 2 epochs
    assert ckpt["optimizer_states"][0]["param_groups"][0]["lr"] == pytest.approx(0.005)
