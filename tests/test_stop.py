"""SIGTERM during DDP training (issue 13): to the launcher alone, or to every process of the job at once as a
scheduler does, during ~3 s training steps and during a long validation. Each run must leave `last.ckpt`
of the step it reached, end every process within 60 s with 143, and resume to the same weights as an
uninterrupted run."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from trainer import Task, Trainer
from trainer.checkpoint import load

HERE = os.path.dirname(os.path.abspath(__file__))
FT = os.path.join(HERE, "scripts", "ft_train.py")
COMMON = ("--epochs", "2", "--val-sleep", "0")  # 6 steps an epoch, 8 validation batches per rank after each


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    return env


def _run(tmp, name: str, *extra: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, FT, str(tmp / f"{name}.pt"), str(tmp / name), *COMMON, *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=_env())


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[str, torch.Tensor]:
    """The final weights of the same run, never interrupted."""
    tmp = tmp_path_factory.mktemp("ref")
    proc = _run(tmp, "ref")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return torch.load(tmp / "ref.pt")


def _children(pid: int) -> list[int]:
    """Every live descendant of `pid` (from /proc: the workers run in sessions of their own)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parents.items() if pp == p]
        found += kids
        todo += kids
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _interrupt(tmp, name: str, wait_for: str, mode: str, *extra: str) -> tuple[int, str, str]:
    """Start the job, send SIGTERM when rank 0 prints `wait_for`, and wait for every process to end.
    Returns the launcher's exit code, its stdout and stderr (the workers' output included)."""
    err_path = tmp / f"{name}.err"
    with open(err_path, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, FT, str(tmp / f"{name}.pt"), str(tmp / name), *COMMON, *extra],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env=_env(),
            start_new_session=True,  # the job's own process group, as under a scheduler
        )
        assert proc.stdout is not None
        seen, deadline = [], time.monotonic() + 180
        for line in proc.stdout:
            seen.append(line)
            if line.strip() == wait_for or time.monotonic() > deadline:
                break
        assert seen and seen[-1].strip() == wait_for, "".join(seen) + err_path.read_text()[-3000:]
        workers = _children(proc.pid)
        assert len(workers) >= 2, workers
        start = time.monotonic()
        os.killpg(proc.pid, signal.SIGTERM)  # the launcher's group: torch starts each worker in its own
        if mode == "every-process":  # a scheduler's kill reaches every process of the job (SLURM's cgroup)
            for pid in workers:
                os.killpg(pid, signal.SIGTERM)
        for _ in range(2 if mode == "launcher-repeated" else 0):  # repeats must not end the launcher's wait
            time.sleep(1)
            os.killpg(proc.pid, signal.SIGTERM)
        rest, _ = proc.communicate(timeout=60)
        while any(_alive(p) for p in workers) and time.monotonic() - start < 60:
            time.sleep(0.2)
        assert time.monotonic() - start < 60, "a process outlived SIGTERM by 60 s"
        assert not any(_alive(p) for p in workers)
        print(f"{mode}: every process ended {time.monotonic() - start:.1f} s after SIGTERM")
    return proc.returncode, "".join(seen) + rest, err_path.read_text()


def _check(tmp, name: str, code: int, err: str, reference, *extra: str) -> tuple[dict[str, Any], str]:
    """The job exited 143 on every process, saved last.ckpt at the step it stopped at, and resumes exactly.
    Returns the checkpoint and the resumed run's stdout."""
    assert code == 143, err[-3000:]
    launcher_done = err.index("[tandem] launcher received SIGTERM; workers stopped.")
    for rank in (0, 1):
        assert -1 < err.find(f"rank {rank} exits with 143") < launcher_done, err[-3000:]  # it waited for them
        # each worker acts on one SIGTERM; a copy (scheduler + launcher) is reported and ignored
        assert err.count(f"rank {rank} received SIGTERM:") == 1, err[-3000:]
        assert err.count(f"rank {rank} received SIGTERM again") <= 1, err[-3000:]
    stopped = re.findall(r"stopping at global step (\d+) after SIGTERM; checkpoint saved to (\S+)", err)
    assert len(stopped) == 1, err[-3000:]
    step, path = int(stopped[0][0]), stopped[0][1]
    assert path == str(tmp / name / "ckpts" / "last.ckpt")
    ckpt = load(path)  # read before the resumed run overwrites it
    assert ckpt["global_step"] == step
    resumed = _run(tmp, name, *extra)  # the same command without the sleeps: resume="auto" finds last.ckpt
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    final = torch.load(tmp / f"{name}.pt")
    assert final.keys() == reference.keys()
    for k in reference:
        assert torch.equal(final[k], reference[k]), k
    return ckpt, resumed.stdout


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["launcher", "every-process", "launcher-repeated"])
def test_sigterm_during_slow_steps_saves_the_reached_step_and_resumes_exactly(tmp_path, reference, mode):
    name = "steps"
    code, out, err = _interrupt(tmp_path, name, "STEP 2", mode, "--step-sleep", "3")
    step = _check(tmp_path, name, code, err, reference)[0]["global_step"]
    if mode == "launcher-repeated":  # the launcher forwarded the signal once, and waited (see _check)
        assert "received SIGTERM again" not in err.replace("launcher received SIGTERM again", "")
    assert 3 <= step < 6  # signalled during step 3 (index 2): stops at the next agreed boundary
    assert f"STEP {step}" not in out  # no step ran after the one it saved


@pytest.mark.slow
def test_sigterm_under_fsdp_saves_a_sharded_checkpoint_and_resumes_exactly(tmp_path):
    """The same stop under strategy='fsdp': each rank writes its shard of last.ckpt (a directory)."""
    ref = _run(tmp_path, "ref", "--fsdp")
    assert ref.returncode == 0, ref.stderr[-3000:]
    code, out, err = _interrupt(tmp_path, "steps", "STEP 2", "launcher", "--step-sleep", "3", "--fsdp")
    ckpt, resumed = _check(tmp_path, "steps", code, err, torch.load(tmp_path / "ref.pt"), "--fsdp")
    assert os.path.isdir(tmp_path / "steps" / "ckpts" / "last.ckpt")
    assert 3 <= ckpt["global_step"] < 6 and f"STEP {ckpt['global_step']}" not in out
    for rank in (0, 1):  # the resumed run starts at the saved step (before 2026-11-26: at 0, from scratch)
        assert f"rank {rank} attempt 0: starts at step {ckpt['global_step']}" in resumed, resumed[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["launcher", "every-process"])
def test_sigterm_during_long_validation_saves_and_resumes_exactly(tmp_path, reference, mode):
    name = "val"
    code, out, err = _interrupt(tmp_path, name, "VAL 1", mode, "--val-sleep", "2")
    ckpt, resumed = _check(tmp_path, name, code, err, reference)
    assert "VAL 7" not in out  # it stopped inside epoch 0's validation, at its end (6 steps an epoch)
    # the checkpoint is the moment before that validation: the resumed run repeats it, then epoch 1's
    assert ckpt["global_step"] == 6 and ckpt["loop"]["batch_in_epoch"] == 6
    assert not ckpt["loop"]["epoch_finished"]
    assert resumed.count("VAL 0") == 2 and resumed.count("VAL 7") == 2


# ----- one process: a stop inside a validation that feeds a ReduceLROnPlateau -----------------------------
class _Plateau(Task):
    """Dropout, shuffled data, and a plateau scheduler on the validation loss; records what the scheduler
    sees. Sends itself SIGTERM at validation batch 1 after global step `kill_step`."""

    def __init__(self, kill_step: int = -1) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(3, 16), torch.nn.Dropout(0.3), torch.nn.Linear(16, 1))
        self.kill_step, self.seen = kill_step, []

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.mse_loss(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        if self.global_step == self.kill_step and batch_idx == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        x, y = batch
        self.log("val_loss", F.mse_loss(self.net(x), y))

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.05)
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=0)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": plateau, "monitor": "val_loss"}}

    def lr_scheduler_step(self, scheduler, metric):
        self.seen.append((self.global_step, float(metric)))
        scheduler.step(metric)


def _plateau_fit(root, task: _Plateau, ckpt_path: str | None = None) -> Trainer:
    g = torch.Generator().manual_seed(0)
    train = TensorDataset(torch.randn(32, 3, generator=g), torch.randn(32, 1, generator=g))
    val = TensorDataset(torch.randn(16, 3, generator=g), torch.randn(16, 1, generator=g))
    trainer = Trainer(
        max_epochs=3,
        val_check_interval=4,  # a validation after batch 4 of 8, and one at each epoch's end
        default_root_dir=str(root),
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    torch.manual_seed(1)
    trainer.fit(task, DataLoader(train, 4, shuffle=True), DataLoader(val, 4), ckpt_path=ckpt_path)
    return trainer


@pytest.mark.parametrize("kill_step", [12, 16], ids=["mid-epoch", "epoch-end"])
def test_a_stop_inside_validation_repeats_it_on_resume(tmp_path, kill_step):
    """The checkpoint is the moment before the interrupted validation: resume repeats it, so the plateau
    scheduler sees every validation loss of the uninterrupted run, and the weights end bit-identical."""
    whole = _Plateau()
    reference = _plateau_fit(tmp_path / "whole", whole)
    first = _Plateau(kill_step)
    with pytest.raises(SystemExit) as e:
        _plateau_fit(tmp_path / "cut", first)
    assert e.value.code == 143
    path = str(tmp_path / "cut" / "checkpoints" / "last.ckpt")
    assert load(path)["global_step"] == kill_step
    resumed = _Plateau()
    trainer = _plateau_fit(tmp_path / "cut", resumed, ckpt_path=path)
    assert first.seen + resumed.seen == whole.seen  # (global step, validation loss) per scheduler step
    assert trainer.optimizers[0].param_groups[0]["lr"] == reference.optimizers[0].param_groups[0]["lr"]
    for (k, a), b in zip(whole.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), k
