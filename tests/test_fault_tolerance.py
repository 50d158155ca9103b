"""Faults: a rank SIGKILLed mid-epoch under elastic restarts, kills during checkpoint writes, a stuck rank,
SIGTERM, uneven inputs. Each compares with an uninterrupted run or bounds the time to a clean exit."""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from tandem_core.errors import TaskError
from tests.conftest import free_port
from trainer import Task, Trainer
from trainer.checkpoint import load

pytestmark = pytest.mark.slow  # multi-process fault drills (tens of seconds each): make test-slow

HERE = os.path.dirname(os.path.abspath(__file__))
FT = os.path.join(HERE, "scripts", "ft_train.py")
WRITER = os.path.join(HERE, "scripts", "ckpt_writer.py")


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    return env


def _ft(tmp, name: str, *extra: str, timeout: float = 180) -> tuple[subprocess.CompletedProcess[str], str]:
    out = str(tmp / f"{name}.pt")
    proc = subprocess.run(
        [sys.executable, FT, out, str(tmp / name), *extra],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_env(),
    )
    return proc, out


def test_sigkilled_rank_restarts_and_ends_bit_identical(tmp_path):
    ref, ref_out = _ft(tmp_path, "ref")
    assert ref.returncode == 0, ref.stderr[-3000:]
    run, run_out = _ft(tmp_path, "killed", "--kill-rank", "1", "--kill-step", "5", "--max-restarts", "1")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Signals.SIGKILL" in run.stderr or "SIGKILL" in run.stderr or "-9" in run.stderr
    a, b = torch.load(ref_out), torch.load(run_out)
    for k in a:
        assert torch.equal(a[k], b[k]), k


def _starts(stdout: str) -> dict[tuple[int, int], tuple[int, int]]:
    """(rank, attempt) -> (global step at on_train_start, at the first training_step), from ft_train.py."""
    found: dict[tuple[int, int], dict[str, int]] = {}
    for rank, attempt, what, step in re.findall(
        r"rank (\d+) attempt (\d+): (starts at|first) step (\d+)", stdout
    ):
        found.setdefault((int(rank), int(attempt)), {})[what] = int(step)
    return {k: (v.get("starts at", -1), v.get("first", -1)) for k, v in found.items()}


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["single", "ddp", "fsdp"])
def test_torchrun_restart_resumes_at_the_saved_step(tmp_path, strategy):
    """A rank SIGKILLed at step 5 under torchrun --max-restarts=1: the restarted attempt must begin at step 4
    (the last.ckpt saved every 2 steps), not at 0, and end bit-identical to an uninterrupted run. Before the
    lookup took directories, FSDP's attempt 1 began at step 0 (its sharded last.ckpt is a directory) and
    wrote last-v1.ckpt beside it; its final weights matched anyway (a fresh seeded run does)."""
    flags = {"single": ["--single"], "ddp": [], "fsdp": ["--fsdp"]}[strategy]
    ranks = 1 if strategy == "single" else 2
    ref, ref_out = _ft(tmp_path, "ref", *flags)
    assert ref.returncode == 0, ref.stderr[-3000:]
    out = str(tmp_path / "killed.pt")
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={ranks}",
        "--max-restarts=1",
    ]
    torchrun += ["--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}"]
    killed = subprocess.run(
        [
            *torchrun,
            FT,
            out,
            str(tmp_path / "killed"),
            *flags,
            "--kill-rank",
            str(ranks - 1),
            "--kill-step",
            "5",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=_env(),
    )
    assert killed.returncode == 0, killed.stderr[-3000:]
    assert "SIGKILL" in killed.stderr or "-9" in killed.stderr  # the kill did happen
    expected = {(r, a): (0, 0) if a == 0 else (4, 4) for r in range(ranks) for a in (0, 1)}
    assert _starts(killed.stdout) == expected, killed.stdout[-3000:]
    assert sorted(os.listdir(tmp_path / "killed" / "ckpts")) == ["last.ckpt"]  # replaced, no last-v1.ckpt
    a, b = torch.load(ref_out), torch.load(out)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_sigkill_during_checkpoint_write_leaves_a_loadable_file(tmp_path):
    path = str(tmp_path / "last.ckpt")
    rng = random.Random(0)
    generation = 0
    for _ in range(6):
        proc = subprocess.Popen(
            [sys.executable, WRITER, path],
            stdout=subprocess.PIPE,
            text=True,
            env={**_env(), "GENERATION": str(generation)},
        )
        assert proc.stdout is not None
        first = proc.stdout.readline()  # one generation is complete: the next write is under way
        assert first.strip()
        time.sleep(rng.uniform(0.0, 0.25))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        ckpt = load(path)  # raises CheckpointError if the file were torn
        assert ckpt["generation"] >= int(first)
        generation = ckpt["generation"] + 1
    leftovers = [f for f in os.listdir(tmp_path) if f != "last.ckpt"]
    assert all(f.startswith(".tmp-") for f in leftovers)  # only unfinished temporaries, never a torn file


def test_a_plain_torch_save_killed_mid_write_is_torn(tmp_path):
    """The control for the test above: without the atomic rename a kill does corrupt the file."""
    path = str(tmp_path / "plain.ckpt")
    torn = 0
    for i in range(5):
        proc = subprocess.Popen(
            [sys.executable, WRITER, path, "--plain"], stdout=subprocess.PIPE, text=True, env=_env()
        )
        assert proc.stdout is not None
        proc.stdout.readline()
        time.sleep(0.02 + 0.01 * i)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        try:
            load(path)
        except Exception:
            torn += 1
    assert torn >= 1


def test_stuck_rank_times_out_with_a_named_error(tmp_path):
    start = time.monotonic()
    run, _ = _ft(tmp_path, "stuck", "--stall-rank", "1", "--timeout-s", "5", timeout=90)
    assert run.returncode != 0
    assert (
        time.monotonic() - start < 90
    )  # 5 s timeout + >= 20 s stop grace of the stuck rank + start-up (loaded CI)
    # rank 0 waits for rank 1's gradients: a DistributedError naming the rank, the operation and the limit
    assert (
        "DistributedError: rank 0/2: gradient all-reduce did not complete within timeout_s=5s" in run.stderr
    )
    assert "raise DDPStrategy(timeout_s=...)" in run.stderr  # and what to change
    stuck = run.stderr.split("rank 1 did not reach a step boundary")
    assert len(stuck) == 2 and "ft_train.py" in stuck[1]  # the dump shows where rank 1 is stuck


def test_sigterm_stops_all_ranks_with_a_checkpoint(tmp_path):
    out = str(tmp_path / "term.pt")
    proc = subprocess.Popen(
        [sys.executable, FT, out, str(tmp_path / "term"), "--sigterm-wait", "--epochs", "50"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 90
    for line in proc.stdout:
        if "READY" in line or time.monotonic() > deadline:
            break
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert time.monotonic() - start < 30
    assert proc.returncode != 0
    assert "stopping" in err.lower()
    ckpt = load(str(tmp_path / "term" / "ckpts" / "last.ckpt"))
    assert ckpt["global_step"] >= 3


@pytest.mark.parametrize("kind", ["map", "stream"])
def test_uneven_inputs_end_the_epoch_together(tmp_path, kind):
    run, _ = _ft(tmp_path, kind, "--uneven", kind, "--epochs", "2", timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    # rank 0 has 10 batches an epoch (5 for the map split of 8), rank 1 has 7 (4): both stop with rank 1
    steps = 7 * 2 if kind == "stream" else 4 * 2
    assert f"rank 0 finished at step {steps}" in run.stdout
    assert f"rank 1 finished at step {steps}" in run.stdout


def test_sigint_on_one_process_checkpoints_and_exits_130(tmp_path):
    proc = subprocess.Popen(
        [
            sys.executable,
            FT,
            str(tmp_path / "x.pt"),
            str(tmp_path / "int"),
            "--single",
            "--sigterm-wait",
            "--epochs",
            "50",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if "READY" in line:
            break
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err[-2000:]
    assert "after SIGINT; checkpoint saved to" in err
    assert load(str(tmp_path / "int" / "ckpts" / "last.ckpt"))["global_step"] >= 3


# ----- non-finite losses -------------------------------------------------------------------------------
class _NaNAt(Task):
    """A linear model whose loss is NaN at one global step."""

    def __init__(self, bad_step: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(4, 1)
        self.bad_step = bad_step

    def training_step(self, batch, batch_idx):
        (x,) = batch
        loss = self.lin(x).pow(2).mean()
        return loss * float("nan") if self.global_step == self.bad_step else loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _nan_fit(task: Task, **kwargs) -> Trainer:
    data = DataLoader(
        TensorDataset(torch.randn(24, 4, generator=torch.Generator().manual_seed(0))), batch_size=4
    )
    trainer = Trainer(
        max_epochs=1,
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        **kwargs,
    )
    trainer.fit(task, data)
    return trainer


def test_detect_nonfinite_raise_names_the_step_and_value():
    with pytest.raises(TaskError, match=r"training loss is nan at global step 2 .*detect_nonfinite='skip'"):
        _nan_fit(_NaNAt(2), detect_nonfinite="raise")


def test_detect_nonfinite_skip_equals_a_run_without_that_batch_update():
    skipped = _NaNAt(2)
    _nan_fit(skipped, detect_nonfinite="skip")
    assert all(torch.isfinite(p).all() for p in skipped.parameters())

    class ZeroAt(_NaNAt):  # reference: the same batch contributes no gradient (plain SGD: no update)
        def training_step(self, batch, batch_idx):
            (x,) = batch
            loss = self.lin(x).pow(2).mean()
            return loss * 0.0 if self.global_step == self.bad_step else loss

    reference = ZeroAt(2)
    _nan_fit(reference)
    for a, b in zip(skipped.parameters(), reference.parameters()):
        assert torch.equal(a, b)


def test_nonfinite_off_lets_nan_through():
    task = _NaNAt(2)
    _nan_fit(task)  # the default: no host sync per step, no check
    assert not torch.isfinite(task.lin.weight).all()
