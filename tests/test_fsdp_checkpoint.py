"""FSDP checkpoints: sharded directories and gathered files, saved by 2 processes and loaded by 1, 2 and 3;
a resumed run against an uninterrupted one; a rank SIGKILLed under torchrun --max-restarts=1."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest
import torch
from torch.utils.data import DataLoader

from callbacks import Callback, ModelCheckpoint
from strategies.fsdp import FSDPStrategy
from tandem_core.errors import CheckpointError
from tests.conftest import FAST, free_port, run_distributed
from trainer import Trainer
from trainer.checkpoint import load

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "scripts", "fsdp_train.py")
sys.path.insert(0, os.path.join(HERE, "scripts"))
from fsdp_train import Block, Tower, full_state, make_data  # noqa: E402

GLOBAL_BATCH = 12  # 48 samples: 4 steps per epoch at 1, 2 and 3 processes


def _fit(
    world: int, ckpt_path: str | None = None, save_full: bool = False, callbacks=(), opt="adam", **kwargs
):
    task = Tower(opt=opt)
    options = {**FAST, "enable_checkpointing": any(isinstance(c, ModelCheckpoint) for c in callbacks)}
    trainer = Trainer(
        strategy=FSDPStrategy(wrap=[Block], save_full=save_full),
        devices=world,
        max_epochs=2,
        callbacks=list(callbacks),
        **options,
        **kwargs,
    )
    trainer.fit(task, DataLoader(make_data(), batch_size=GLOBAL_BATCH // world), ckpt_path=ckpt_path)
    return task, trainer


class SaveInsideWindow(Callback):
    """Tries to checkpoint after the first micro-batch of an accumulation window."""

    def __init__(self, path: str) -> None:
        self.path, self.error = path, ""

    def on_train_batch_end(self, trainer, task, outputs, batch, batch_idx):
        if batch_idx == 0:
            try:
                trainer.save_checkpoint(self.path)
            except CheckpointError as e:
                self.error = str(e)


class StartStep(Callback):
    """The global step training starts (or resumes) at."""

    step = -1

    def on_train_start(self, trainer, task):
        self.step = trainer.global_step


def _save_at_2(rank: int, world: int, root: str) -> dict[str, object]:
    out: dict[str, object] = {"uninterrupted": full_state(_fit(world)[0])}
    ckpts = os.path.join(root, "ckpts")  # the newest step's checkpoint and last.ckpt, both directories
    checkpointing = ModelCheckpoint(dirpath=ckpts, every_n_train_steps=1, save_last=True)
    task, _ = _fit(world, callbacks=[checkpointing], max_steps=3)  # stops inside the first epoch
    out["at_3"], out["listing"] = full_state(task), sorted(os.listdir(ckpts))
    _, trainer = _fit(world, save_full=True, max_steps=3)
    trainer.save_checkpoint(os.path.join(root, "full.ckpt"))  # the same point, gathered into one file
    for name, path in (("dir", os.path.join(ckpts, "last.ckpt")), ("file", os.path.join(root, "full.ckpt"))):
        out[f"resumed_{name}"] = full_state(_fit(world, ckpt_path=path)[0])
    window = SaveInsideWindow(os.path.join(root, "window.ckpt"))
    _fit(world, callbacks=[window], accumulate_grad_batches=2, max_steps=1)
    out["window"] = window.error
    return out


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("fsdp_ckpt"))
    return root, run_distributed(_save_at_2, root, world_size=2, timeout=300)


@pytest.mark.slow
def test_resumed_from_either_form_at_2_is_bit_identical_to_uninterrupted(saved):
    _, results = saved
    for r in results:
        assert r["listing"] == ["epoch=0-step=3.ckpt", "last.ckpt"]  # older ones removed, no temporaries left
        for name in ("resumed_dir", "resumed_file"):
            for k, v in r["uninterrupted"].items():
                assert torch.equal(r[name][k], v), (name, k)
        assert "inside a gradient accumulation window" in r["window"]


@pytest.mark.slow
def test_one_process_reads_both_forms_without_a_group(saved):
    root, results = saved
    at_3 = results[0]["at_3"]
    sharded = load(os.path.join(root, "ckpts", "last.ckpt"))
    gathered = load(os.path.join(root, "full.ckpt"))
    assert sorted(os.listdir(os.path.join(root, "ckpts", "last.ckpt")))[:3] == [
        ".metadata",
        "__0_0.distcp",
        "__1_0.distcp",
    ]
    for ckpt in (sharded, gathered):
        assert ckpt["task_class"] == "fsdp_train.Tower" and ckpt["global_step"] == 3
        for k, v in at_3.items():
            assert torch.equal(ckpt["state_dict"][k], v), k
    # the gathered file is an ordinary checkpoint: its optimizer state loads into a plain optimizer
    task = Tower(opt="adam")
    task.load_state_dict(gathered["state_dict"])
    optimizer = task.configure_optimizers()
    optimizer.load_state_dict(gathered["optimizer_states"][0])
    assert int(optimizer.state_dict()["state"][0]["step"]) == 3
    # trainer.test(ckpt_path=<directory>) under a strategy that never shards
    trainer = Trainer(strategy="single", **FAST)
    tested = trainer.test(
        Tower(opt="adam"),
        DataLoader(make_data(), batch_size=5),
        ckpt_path=os.path.join(root, "ckpts", "last.ckpt"),
    )
    reference = Trainer(strategy="single", **FAST).test(task, DataLoader(make_data(), batch_size=5))
    assert tested[0]["test/loss"] == pytest.approx(reference[0]["test/loss"], abs=1e-7)


def _resume(rank: int, world: int, root: str) -> dict[str, object]:
    out = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for name, path in (
            ("dir", os.path.join(root, "ckpts", "last.ckpt")),
            ("file", os.path.join(root, "full.ckpt")),
        ):
            task, trainer = _fit(world, ckpt_path=path)
            out[name], out[f"{name}_steps"] = full_state(task), trainer.global_step
    out["notices"] = [str(w.message) for w in caught if "nothing to shard" in str(w.message)]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 3])
def test_a_checkpoint_of_2_processes_resumes_on_1_and_on_3(saved, world):
    root, results = saved
    uninterrupted = results[0]["uninterrupted"]
    for r in run_distributed(_resume, root, world_size=world, timeout=300):
        assert bool(r["notices"]) == (world == 1)  # one process: the notice that nothing is sharded
        for name in ("dir", "file"):
            assert r[f"{name}_steps"] == 8
            for k, v in uninterrupted.items():  # the same global batches, reduced over another world size
                torch.testing.assert_close(r[name][k], v, atol=1e-6, rtol=0, msg=f"{name} {k}")


def _plain_sgd_full_file(rank: int, world: int, root: str) -> dict[str, object]:
    """save_full=True with SGD without momentum: the gathered optimizer state has no per-parameter entries."""
    out: dict[str, object] = {"uninterrupted": full_state(_fit(world, opt="plain-sgd")[0])}
    _, trainer = _fit(world, save_full=True, opt="plain-sgd", max_steps=3)
    path = os.path.join(root, "plain.ckpt")
    trainer.save_checkpoint(path)
    start = StartStep()
    task, trainer = _fit(world, ckpt_path=path, save_full=True, opt="plain-sgd", callbacks=[start])
    out["resumed"], out["steps"], out["started_at"] = full_state(task), trainer.global_step, start.step
    return out


@pytest.mark.slow
def test_a_gathered_file_of_an_optimizer_without_state_resumes_like_uninterrupted(tmp_path):
    for r in run_distributed(_plain_sgd_full_file, str(tmp_path), world_size=2, timeout=300):
        assert (r["started_at"], r["steps"]) == (3, 8)  # resumed at the saved step, not from 0
        for k, v in r["uninterrupted"].items():
            assert torch.equal(r["resumed"][k], v), k


def _run(cmd: list[str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.slow
def test_rank_killed_under_torchrun_restarts_and_ends_bit_identical(tmp_path):
    ref = _run([sys.executable, SCRIPT, str(tmp_path / "ref.pt"), str(tmp_path / "ref")])  # Tandem launches
    assert ref.returncode == 0, ref.stderr[-3000:]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--max-restarts=1"]
    torchrun += ["--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}"]
    killed = _run(
        [
            *torchrun,
            SCRIPT,
            str(tmp_path / "killed.pt"),
            str(tmp_path / "killed"),
            "--kill-rank",
            "1",
            "--kill-step",
            "5",
        ]
    )
    assert killed.returncode == 0, killed.stderr[-3000:]
    assert "SIGKILL" in killed.stderr or "-9" in killed.stderr  # the kill did happen
    a, b = torch.load(tmp_path / "ref.pt"), torch.load(tmp_path / "killed.pt")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="cpu_offload needs 2 CUDA devices (one per rank)")
def test_cpu_offload_on_two_gpus_trains_like_no_offload_with_shards_in_host_memory(tmp_path):
    """Written for a machine with 2 GPUs (CI has none): FSDP's CPUOffloadPolicy keeps each rank's shards
    and optimizer state in host memory; the weights must match the run without offload."""
    runs = {}
    for name, extra in (("gpu", []), ("offload", ["--cpu-offload"])):
        out = _run(
            [
                sys.executable,
                SCRIPT,
                str(tmp_path / f"{name}.pt"),
                str(tmp_path / name),
                "--accelerator",
                "cuda",
            ]
            + extra
        )
        assert out.returncode == 0, out.stderr[-3000:]
        runs[name] = (torch.load(tmp_path / f"{name}.pt"), out.stdout)
    assert "rank 0: shards on cuda" in runs["gpu"][1]
    assert "rank 0: shards on cpu" in runs["offload"][1] and "rank 1: shards on cpu" in runs["offload"][1]
    for k, v in runs["gpu"][0].items():
        torch.testing.assert_close(runs["offload"][0][k].cpu(), v.cpu(), atol=1e-6, rtol=0)
