"""Tandem's deliberate differences from Lightning around plugins, the connector and profilers (docs/porting.md,
"Plugins"), each as Tandem behaves: refused plugins name what to use instead, SLURM's batch script starts its
own workers, the environment answers ranks only until the group is joined, and the rest."""

from __future__ import annotations

import os
from unittest import mock

import pytest
import torch

import trainer.plugins as plugins
from strategies import REFUSED, DDPStrategy, StrategyRegistry
from strategies.accelerators import CPUAccelerator
from strategies.environments import SLURMEnvironment
from tandem_core.errors import ConfigError
from tandem_core.rank_zero import rank_zero_only
from trainer import Trainer
from trainer.profilers import AdvancedProfiler, PassThroughProfiler, PyTorchProfiler

QUIET = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)


@pytest.mark.parametrize(
    ("name", "args", "instead"),
    [
        ("DeepSpeedPrecision", ("16-true",), "strategy='fsdp'"),
        ("BitsandbytesPrecision", (), "bf16"),
        ("TransformerEnginePrecision", (), "bf16"),
        ("XLAPrecision", ("bf16-true",), "CUDA or the CPU"),
        ("MPIEnvironment", (), "torchrun or srun"),
        ("XLAEnvironment", (), "CUDA or the CPU"),
    ],
)
def test_plugins_of_libraries_tandem_does_not_use_are_refused_when_built(name, args, instead):
    with pytest.raises(ConfigError, match=instead):
        getattr(plugins, name)(*args)


def test_refused_strategy_names_are_not_registry_entries():
    for name in ("deepspeed", "deepspeed_stage_3", "xla"):
        assert name not in StrategyRegistry and name in REFUSED
        with pytest.raises(ConfigError, match="not"):
            Trainer(strategy=name, **QUIET)


def test_slurms_batch_script_starts_its_own_workers():
    batch = {"SLURM_JOB_ID": "78", "SLURM_JOB_NAME": "train.sbatch", "SLURM_NTASKS": "2", "SLURM_PROCID": "0"}
    with mock.patch.dict(os.environ, batch):
        env = SLURMEnvironment()
        assert (
            SLURMEnvironment.detect() and not env.creates_processes_externally
        )  # Lightning: True (then waits)
    with mock.patch.dict(os.environ, {**batch, "SLURM_STEP_ID": "0"}):
        assert SLURMEnvironment().creates_processes_externally  # an srun task


def test_the_environment_answers_ranks_until_the_group_is_joined():
    with mock.patch.dict(os.environ, {"LOCAL_RANK": "1", "NODE_RANK": "1"}):
        t = Trainer(strategy="ddp", accelerator="cpu", devices=2, num_nodes=2, **QUIET)
        assert t.global_rank == 3  # from the environment, as Lightning's
        assert (
            rank_zero_only.rank == 0
        )  # not set by the Trainer (Lightning sets it): RANK is read once joined
        os.environ.update(RANK="3", WORLD_SIZE="4")  # what joining exports (strategies/environments/base.py)
        assert rank_zero_only.rank == 3 == t.global_rank


def test_lightnings_environment_started_by_hand_needs_an_agreed_port():
    strategy = Trainer(strategy="ddp", accelerator="cpu", devices=2, **QUIET).strategy
    with mock.patch.dict(os.environ, {"LOCAL_RANK": "0"}):
        os.environ.pop("MASTER_PORT", None)
        with pytest.raises(ConfigError, match="MASTER_PORT"):
            strategy.launch()  # each process would pick a free port of its own


def test_fsdp_runs_on_the_cpu_and_its_precision_is_fully_shards_policy():
    t = Trainer(strategy="fsdp", accelerator="cpu", precision="bf16-mixed", **QUIET)  # Lightning: GPU only
    policy = t.precision_plugin.mixed_precision_config
    assert type(t.precision_plugin).__name__ == "FSDPPrecision"
    assert (policy.param_dtype, policy.reduce_dtype) == (torch.bfloat16, torch.float32)
    t = Trainer(strategy="fsdp", accelerator="cpu", precision="64-true", **QUIET)  # Lightning: refused
    assert type(t.precision_plugin).__name__ == "DoublePrecision"


def test_a_custom_accelerator_is_refused_by_its_name():
    class Custom(CPUAccelerator):
        @classmethod
        def name(cls) -> str:
            return "custom_acc_name"

    with pytest.raises(ConfigError, match="custom_acc_name"):
        Trainer(accelerator=Custom(), **QUIET)


def test_the_interactive_ddp_strategy_forks_rather_than_refuses():
    strategy = DDPStrategy()
    assert strategy.launcher.is_interactive_compatible  # popen forks in a notebook (Lightning refuses 'ddp')
    assert not DDPStrategy(start_method="spawn").launcher.is_interactive_compatible


def test_profiler_none_and_pass_through_mean_no_profiler():
    assert (
        Trainer(profiler=None, **QUIET).profiler
        is None
        is Trainer(profiler=PassThroughProfiler(), **QUIET).profiler
    )


def test_refused_profiler_arguments_say_why():
    with pytest.raises(ConfigError, match="nsys"):
        PyTorchProfiler(emit_nvtx=True)
    with pytest.raises(ConfigError, match="torch.profiler.profile"):
        PyTorchProfiler(not_an_argument=True)
    assert AdvancedProfiler(dump_stats=True).dump_stats  # (cProfile's, as Lightning's)


def test_a_pytorch_profilers_trace_goes_to_a_folder_per_stage(tmp_path):
    profiler = PyTorchProfiler(dirpath=tmp_path, filename="p")
    with profiler.profile("a"):
        torch.ones(2).sum()
    profiler.describe()
    assert any(f.endswith(".pt.trace.json") for f in os.listdir(tmp_path / "stage"))  # TensorBoard's layout
    assert (tmp_path / "p.txt").exists()
