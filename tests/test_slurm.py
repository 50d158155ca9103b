"""strategies/slurm.py and trainer/plugins/environments.py without a cluster: reading SLURM's variables,
the checks of a job's shape, SLURMEnvironment as Lightning's plugin, and the requeue signal's path through
fit (one process, with a stand-in `scontrol` on PATH that records what it is asked). The same on a real
slurm-wlm: tests/test_slurm_lab.py."""

from __future__ import annotations

import os
import signal
import stat
import threading
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from strategies import launch, slurm
from strategies.ddp import DDPStrategy
from tandem_core.errors import ConfigError
from trainer import Task, Trainer
from trainer.options import OptionError
from trainer.plugins import SLURMEnvironment
from trainer.plugins.environments import SLURMEnvironment as FromEnvironments

STEP = {  # a task of `srun` in `sbatch -N 2 --ntasks-per-node=2`
    "SLURM_JOB_ID": "77",
    "SLURM_JOB_NAME": "train.sbatch",
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "3",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "SLURM_NTASKS": "4",
    "SLURM_STEP_NUM_TASKS": "4",
    "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_NNODES": "2",
    "SLURM_STEP_NODELIST": "n[1-2]",
}
BATCH = {"SLURM_JOB_ID": "78", "SLURM_JOB_NAME": "train.sbatch", "SLURM_PROCID": "0", "SLURM_NNODES": "1"}
RANK_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """No launcher or SLURM variables; whatever slurm.adopt writes is undone."""
    saved = dict(os.environ)
    for var in [*RANK_VARS, *(v for v in os.environ if v.startswith(("SLURM_", "TORCHELASTIC_")))]:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(slurm, "_adopted", False)
    yield monkeypatch
    monkeypatch.undo()
    os.environ.clear()
    os.environ.update(saved)


def test_per_node_counts_expand():
    assert slurm.expand_counts("2(x3),1") == [2, 2, 2, 1]
    assert slurm.expand_counts("4") == [4]
    with pytest.raises(ConfigError, match="tasks per node"):
        slurm.expand_counts("2x3")


def test_an_srun_task_takes_its_ranks_and_this_nodes_task_count(env):
    for k, v in STEP.items():
        env.setenv(k, v)
    assert launch.launched_externally() and slurm.adopted()
    got = {k: os.environ[k] for k in RANK_VARS}
    assert got["RANK"] == "3" and got["WORLD_SIZE"] == "4" and got["LOCAL_RANK"] == "1"
    assert got["LOCAL_WORLD_SIZE"] == "2" and got["MASTER_ADDR"] == "n1"
    slurm.check_step(devices=2, num_nodes=2)


def test_tasks_per_node_other_than_devices_names_both(env):
    for k, v in STEP.items():
        env.setenv(k, v)
    slurm.adopt()
    with pytest.raises(ConfigError, match=r"--ntasks-per-node=2.*devices=4"):
        DDPStrategy(accelerator="cpu", devices=4, num_nodes=2).launch()
    with pytest.raises(ConfigError, match=r"--nodes=2.*num_nodes=1"):
        DDPStrategy(accelerator="cpu", devices=2, num_nodes=1).launch()


def test_a_batch_script_without_srun_starts_the_workers_itself(env):
    for k, v in BATCH.items():
        env.setenv(k, v)
    calls: list[int] = []
    env.setattr(launch, "relaunch", lambda n, r=0: calls.append(n))
    env.setattr(DDPStrategy, "_join_group", lambda self: None)
    DDPStrategy(accelerator="cpu", devices=2).launch()
    assert calls == [2]  # as a plain `python train.py`: this process starts 2 workers on this node


def test_a_batch_script_without_srun_on_several_nodes_says_srun(env):
    for k, v in {**BATCH, "SLURM_NNODES": "2"}.items():
        env.setenv(k, v)
    with pytest.raises(ConfigError, match=r"without srun.*srun python"):
        DDPStrategy(accelerator="cpu", devices=2).launch()


def test_a_batch_script_asking_other_tasks_per_node_than_devices_names_both(env):
    for k, v in {**BATCH, "SLURM_NTASKS_PER_NODE": "4"}.items():
        env.setenv(k, v)
    with pytest.raises(ConfigError, match=r"--ntasks-per-node=4.*devices=2.*srun"):
        DDPStrategy(accelerator="cpu", devices=2).launch()


def test_slurm_environment_is_lightnings_plugin():
    env = SLURMEnvironment()
    assert FromEnvironments is SLURMEnvironment
    assert env.auto_requeue is True and env.requeue_signal == signal.SIGUSR1  # Lightning's defaults
    assert SLURMEnvironment(requeue_signal=signal.SIGUSR2).requeue_signal == signal.SIGUSR2
    with pytest.raises(ConfigError, match="SIGUSR1 or SIGUSR2"):
        SLURMEnvironment(requeue_signal=signal.SIGTERM)
    Trainer(plugins=[SLURMEnvironment(auto_requeue=False)], logger=False)
    Trainer(plugins=SLURMEnvironment(), logger=False)


def test_objects_of_no_plugin_kind_and_two_environments_are_refused():
    class MixedPrecision:  # not Lightning's (trainer.plugins.MixedPrecision): a class of no plugin kind
        pass

    with pytest.raises(OptionError, match="MixedPrecision is of none of them"):
        Trainer(plugins=[SLURMEnvironment(), MixedPrecision()])
    with pytest.raises(OptionError, match="multiple values for ClusterEnvironment"):
        Trainer(plugins=[SLURMEnvironment(), SLURMEnvironment()])


# ----- the requeue signal through fit, with a stand-in scontrol ---------------------------------------------
class Slow(Task):
    def __init__(self, signum: int | None) -> None:
        super().__init__()
        self.net, self.signum = torch.nn.Linear(4, 2), signum

    def training_step(self, batch, batch_idx):
        if self.global_step == 3 and self.signum is not None:
            os.kill(os.getpid(), self.signum)  # the time-limit warning arrives mid-run
            self.signum = None
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


@pytest.fixture
def scontrol(env, tmp_path):
    """A `scontrol` on PATH answering `show job` with Requeue=$REQUEUE and logging every call."""
    log, tool = tmp_path / "scontrol.log", tmp_path / "bin" / "scontrol"
    tool.parent.mkdir()
    tool.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> {log}\n'
        'if [ "$2" = show ]; then echo "JobId=$4 JobName=t Requeue=$REQUEUE Restarts=0 BatchFlag=1"; fi\n'
    )
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    env.setenv("PATH", f"{tool.parent}:{os.environ['PATH']}")
    for k, v in BATCH.items():
        env.setenv(k, v)
    return log


def _fit(tmp_path, signum: int, plugins=None) -> tuple[int, Trainer]:
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(64, 4, generator=g), torch.randint(0, 2, (64,), generator=g))
    trainer = Trainer(
        accelerator="cpu",
        max_epochs=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
        resume="auto",
        plugins=plugins,
    )
    with pytest.raises(SystemExit) as info:
        trainer.fit(Slow(signum), DataLoader(data, batch_size=4))
    # the stop's watchdog ends with the stage: left armed it would os._exit this process 20 s later
    timers = [t for t in threading.enumerate() if isinstance(t, threading.Timer)]
    for t in timers:
        t.join(2)
    assert not any(t.is_alive() for t in timers), "the stop watchdog outlived fit"
    return int(info.value.code), trainer


@pytest.mark.parametrize("requeue", ["1", "0"])
def test_sigusr1_saves_then_requeues_only_a_requeueable_job(scontrol, tmp_path, capfd, requeue):
    os.environ["REQUEUE"] = requeue
    code, trainer = _fit(tmp_path, signal.SIGUSR1)
    err = capfd.readouterr().err
    assert code == 128 + signal.SIGUSR1
    ckpt = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == trainer.global_step == 4  # the next step boundary
    calls = scontrol.read_text().splitlines()
    assert calls[0] == "-o show job 78"
    if requeue == "1":
        assert calls[1:] == ["requeue 78"] and "requeued job 78" in err
    else:
        assert calls[1:] == [] and "not requeued" in err and "sbatch --requeue" in err, err
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL  # handlers restored after fit


def test_sigterm_saves_and_never_requeues(scontrol, tmp_path):
    os.environ["REQUEUE"] = "1"
    code, _ = _fit(tmp_path, signal.SIGTERM)
    assert code == 128 + signal.SIGTERM
    assert not scontrol.exists()  # scontrol never asked


def test_auto_requeue_false_saves_and_says_so(scontrol, tmp_path, capfd):
    os.environ["REQUEUE"] = "1"
    code, _ = _fit(tmp_path, signal.SIGUSR2, plugins=[SLURMEnvironment(False, signal.SIGUSR2)])
    assert code == 128 + signal.SIGUSR2 and (tmp_path / "checkpoints" / "last.ckpt").exists()
    assert "auto_requeue=False" in capfd.readouterr().err and not scontrol.exists()


def test_a_requeue_that_stops_scontrol_itself_counts_as_done(env, tmp_path):
    """Under load, `scontrol requeue` can be killed by the very requeue it asked for (it runs in the job's step):
    SLURM took it when the job then counts one more restart."""
    from trainer.plugins.environments import SLURMEnvironment

    log, tool = tmp_path / "scontrol.log", tmp_path / "bin" / "scontrol"
    tool.parent.mkdir()
    tool.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> {log}\n'
        f'if [ "$2" = show ]; then n=$(grep -c requeue {log}); '
        'echo "JobId=$4 Requeue=1 Restarts=$n BatchFlag=1 JobState=RUNNING"; fi\n'
        'if [ "$1" = requeue ]; then kill -TERM $$; fi\n'
    )
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    env.setenv("PATH", f"{tool.parent}:{os.environ['PATH']}")
    for k, v in BATCH.items():
        env.setenv(k, v)
    done, said = SLURMEnvironment().requeue()
    assert done and said.startswith("requeued job 78"), said
    assert log.read_text().splitlines() == ["-o show job 78", "requeue 78", "-o show job 78"]
