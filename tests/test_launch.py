"""strategies/launch.py: joining torchrun or SLURM (srun) through their environment variables, the command
that re-runs a script, and where DDPStrategy.launch runs the work (this process, or relaunched workers)."""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Iterator

import pytest

from strategies import launch, slurm
from strategies.ddp import DDPStrategy
from tandem_core.errors import ConfigError

TORCHRUN = {
    "RANK": "1",
    "WORLD_SIZE": "4",
    "LOCAL_RANK": "1",
    "MASTER_ADDR": "10.0.0.1",
    "MASTER_PORT": "29500",
}
SLURM = {
    "SLURM_PROCID": "3",
    "SLURM_NTASKS": "8",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "SLURM_NODELIST": "gpu[07-08]",
    "SLURM_JOB_ID": "12345",
    "SLURM_JOB_NAME": "train.sbatch",
    "SLURM_STEP_ID": "0",  # a task of an srun step (the batch script itself has no step id)
    "SLURM_STEP_TASKS_PER_NODE": "4(x2)",
    "SLURM_NNODES": "2",
}
TORCH_VARS = (*TORCHRUN, "LOCAL_WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT")


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """A process started by hand (no launcher variables); whatever a test or launch.py sets is undone."""
    saved = dict(os.environ)  # launch.py writes os.environ itself, behind monkeypatch's back
    for var in (*TORCH_VARS, *[v for v in os.environ if v.startswith("SLURM_")]):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(slurm, "_adopted", False)
    yield monkeypatch
    monkeypatch.undo()  # first, or it would put back values launch.py had set
    os.environ.clear()
    os.environ.update(saved)


def set_vars(env: pytest.MonkeyPatch, variables: dict[str, str]) -> None:
    """Set environment variables for this test only."""
    for name, value in variables.items():
        env.setenv(name, value)


def test_a_plain_process_is_not_launched_externally(env):
    assert not launch.launched_externally()
    assert not any(var in os.environ for var in TORCH_VARS)  # and nothing was invented


def test_torchrun_needs_every_rendezvous_variable(env):
    set_vars(env, TORCHRUN)
    assert launch.launched_externally()
    for missing in TORCHRUN:
        env.delenv(missing)
        assert not launch.launched_externally(), f"launched without {missing}"
        env.setenv(missing, TORCHRUN[missing])


def test_srun_task_becomes_a_torch_rank(env):
    set_vars(env, SLURM)
    assert launch.launched_externally()
    assert (os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["LOCAL_RANK"]) == ("3", "8", "1")
    assert os.environ["MASTER_ADDR"] == "gpu07"  # the first host of the allocation, on every task
    port = int(os.environ["MASTER_PORT"])
    assert 1024 <= port <= 65535


def test_every_task_of_a_job_agrees_on_the_rendezvous_and_jobs_differ(env):
    def rendezvous(procid: str, localid: str, job: str) -> tuple[str, str]:
        for var in TORCH_VARS:
            os.environ.pop(var, None)  # the previous task's adoption (the fixture restores the rest)
        set_vars(env, {**SLURM, "SLURM_PROCID": procid, "SLURM_LOCALID": localid, "SLURM_JOB_ID": job})
        assert launch.adopt_slurm_env()
        return os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]

    assert rendezvous("0", "0", "12345") == rendezvous("7", "3", "12345")
    assert rendezvous("0", "0", "12345")[1] != rendezvous("0", "0", "12346")[1]


def test_srun_defaults_and_explicit_master(env):
    set_vars(env, {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0"})
    # (no SLURM_LOCALID, SLURM_NODELIST)
    assert launch.adopt_slurm_env()
    assert os.environ["LOCAL_RANK"] == "0" and os.environ["MASTER_ADDR"] == "127.0.0.1"
    for var in TORCH_VARS:
        os.environ.pop(var, None)
    set_vars(env, {**SLURM, "MASTER_ADDR": "head", "MASTER_PORT": "4242"})
    assert launch.adopt_slurm_env()
    assert (os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]) == ("head", "4242")  # the user's win


@pytest.mark.parametrize("job_name", ["bash", "interactive"])
def test_an_interactive_allocation_is_not_a_launch(env, job_name):
    set_vars(env, {**SLURM, "SLURM_JOB_NAME": job_name})
    assert not launch.launched_externally()
    assert "RANK" not in os.environ


def test_the_batch_script_itself_is_not_a_launch(env):
    """`python train.py` in a batch script without srun: one process (no step id), whatever --ntasks says."""
    set_vars(env, {k: v for k, v in SLURM.items() if k != "SLURM_STEP_ID"})
    assert not launch.launched_externally()
    assert "RANK" not in os.environ


def test_torchrun_inside_an_allocation_keeps_torchrun_ranks(env):
    set_vars(env, {**SLURM, **TORCHRUN})
    assert not launch.adopt_slurm_env()
    assert launch.launched_externally()
    assert {k: os.environ[k] for k in TORCHRUN} == TORCHRUN


@pytest.mark.parametrize(
    "nodelist,host",
    [
        ("gpu2", "gpu2"),
        ("node[01-04,07],gpu2", "node01"),
        ("a[3,5]", "a3"),
        ("x1,x2", "x1"),
        ("n[001-002]", "n001"),
    ],
)
def test_master_is_the_first_host_of_the_nodelist(env, nodelist, host):
    set_vars(env, {**SLURM, "SLURM_NODELIST": nodelist})
    launch.adopt_slurm_env()
    assert os.environ["MASTER_ADDR"] == host


# ----- the command that re-runs this program ----------------------------------------------------------------
def _main_module(env: pytest.MonkeyPatch, spec_name: str | None, argv: list[str]) -> None:
    """Pretend this program is `python -m spec_name` (or a script when None) with these sys.argv."""
    main = types.ModuleType("__main__")
    main.__spec__ = types.SimpleNamespace(name=spec_name) if spec_name else None
    env.setitem(sys.modules, "__main__", main)
    env.setattr(sys, "argv", argv)


def test_a_script_is_rerun_by_its_absolute_path(env, tmp_path):
    env.chdir(tmp_path)
    _main_module(env, None, ["train.py", "--lr", "0.1"])
    assert launch._command() == ["-u", os.path.join(os.getcwd(), "train.py"), "--lr", "0.1"]


@pytest.mark.parametrize("spec,module", [("pkg.train", "pkg.train"), ("pkg.__main__", "pkg")])
def test_a_module_is_rerun_with_dash_m(env, spec, module):
    _main_module(env, spec, ["/somewhere/train.py", "--epochs", "2"])
    assert launch._command() == ["-u", "-m", module, "--epochs", "2"]


@pytest.mark.parametrize("argv", [["-c"], [""], []])
def test_no_script_file_says_how_to_launch(env, argv):
    _main_module(env, None, argv)
    with pytest.raises(ConfigError, match="torchrun --nproc_per_node=N script.py"):
        launch._command()


# ----- where DDPStrategy.launch runs the work ---------------------------------------------------------------
def _no_relaunch(env: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Record relaunch(nprocs, max_restarts) calls instead of starting workers."""
    calls: list[tuple[int, int]] = []

    def fake(nprocs: int, max_restarts: int = 0) -> None:
        calls.append((nprocs, max_restarts))

    env.setattr(launch, "relaunch", fake)
    env.setattr(DDPStrategy, "_join_group", lambda self: calls.append("joined"))  # no real process group
    return calls


@pytest.mark.parametrize("variables,devices,nodes", [(TORCHRUN, 2, 1), (SLURM, 4, 2)])
def test_under_a_launcher_the_work_runs_in_this_process(env, variables, devices, nodes):
    calls = _no_relaunch(env)
    set_vars(env, variables)
    DDPStrategy(accelerator="cpu", devices=devices, num_nodes=nodes).launch()
    assert calls == ["joined"]  # this process is a worker already: it joins, nothing is started


def test_a_plain_run_relaunches_devices_workers(env):
    calls = _no_relaunch(env)
    DDPStrategy(accelerator="cpu", devices=3, max_restarts=2).launch()
    assert calls[0] == (3, 2)  # the real relaunch exits this process with the workers' status


def test_one_device_is_a_group_of_one_in_this_process(env):
    calls = _no_relaunch(env)
    strategy = DDPStrategy(accelerator="cpu", devices=1)
    strategy.launch()
    assert calls == ["joined"] and strategy._alone
    assert (strategy.comm.rank, strategy.comm.world_size) == (0, 1)


def test_several_nodes_need_a_launcher(env):
    _no_relaunch(env)
    with pytest.raises(ConfigError, match="torchrun .*srun"):
        DDPStrategy(accelerator="cpu", devices=2, num_nodes=2).launch()


def test_a_group_of_one_leaves_the_environment_as_it_was(env):
    """A devices=1 ddp/fsdp fit makes its group on a store of its own. Written into os.environ (as it was
    before), RANK/WORLD_SIZE/LOCAL_WORLD_SIZE=1 made a later devices=2 fit in the same notebook, and every
    subprocess started after it (a torchrun, a CLI run), read as a launcher's job of one process."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from tests.conftest import FAST
    from trainer import Task, Trainer

    class Net(Task):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 2)

        def training_step(self, batch, batch_idx):
            return torch.nn.functional.cross_entropy(self.layer(batch[0]), batch[1])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    before = dict(os.environ)
    data = DataLoader(TensorDataset(torch.randn(8, 4), torch.randint(0, 2, (8,))), batch_size=4)
    for strategy in ("ddp", "fsdp"):
        trainer = Trainer(strategy=strategy, devices=1, max_steps=2, **FAST)
        trainer.fit(Net(), data)
        assert trainer.global_step == 2
    assert dict(os.environ) == before
    assert not launch.launched_externally()
