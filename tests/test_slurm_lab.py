"""Tandem under a real SLURM (Debian's slurm-wlm 22.05; tests/slurmlab.py starts munged, slurmctld and
slurmd, and installs the package with apt when it is missing): srun and batch-script starts equal a
self-launched run, a requeue by SIGTERM (`scontrol requeue`) or by SLURM's time-limit signal (SIGUSR1)
resumes bit-identically at the saved step, a job that may not be requeued says so, and a two-node
`sbatch -N 2` job across the network lab equals a one-node two-task job. Measured times are printed
(`pytest -s`) and written to docs/reliability.md by hand."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from netlab import clean_env, lab_fixture, lab_lock, link_bytes
from slurmlab import ROOT, Slurm, SlurmError, install, unavailable

pytestmark = pytest.mark.slow
SCRIPT = os.path.join(ROOT, "tests", "scripts", "slurm_train.py")
PY = sys.executable
SLOW = ["--step-sleep", "0.3"]  # 24 steps of >= 0.3 s: room to signal the job mid-run
TIMES: dict[str, list[float]] = {}


@pytest.fixture(scope="module")
def cluster() -> Iterator[Slurm]:
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    try:
        install()
    except SlurmError as e:
        pytest.skip(f"cannot install slurm-wlm on this machine: {e}")
    with lab_lock():  # every lab on this machine is brought up under the lab lock (GUIDE.md)
        try:
            c = Slurm.start([("localhost", "127.0.0.1", None)], port=6917)
        except SlurmError as e:
            pytest.fail(f"SLURM did not start on this machine: {e}")
        try:
            yield c
        finally:
            c.down()
    for what, values in TIMES.items():
        print(f"\n{what}: " + ", ".join(f"{v:.1f}" for v in values) + " s")


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    """The uninterrupted run: `python slurm_train.py` self-launching devices=2, outside SLURM."""
    where = tmp_path_factory.mktemp("reference")
    done = subprocess.run(
        [PY, SCRIPT, str(where / "w.pt"), str(where / "root")], capture_output=True, text=True, timeout=300,
        env=clean_env(),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return torch.load(where / "w.pt")


def _equal(out: Path, ref: dict) -> None:
    got = torch.load(out)
    assert got["step"] == ref["step"], (got["step"], ref["step"])
    for k, v in ref["weights"].items():
        assert torch.equal(got["weights"][k], v), k


def _batch(body: str) -> str:
    return f"#!/bin/bash\ncd {ROOT}\n{body}\n"


def _submit(c: Slurm, tmp: Path, body: str, *options: str) -> tuple[int, Path]:
    log = tmp / "job.log"
    return c.sbatch(_batch(body), "-o", str(log), "--open-mode=append", *options), log


def _wait_for(log: Path, pattern: str, timeout: float, c: Slurm, job: int) -> re.Match[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = re.search(pattern, log.read_text(errors="replace")) if log.exists() else None
        if m:
            return m
        time.sleep(0.1)
    raise AssertionError(
        f"no {pattern!r} in the job's output after {timeout:.0f} s: {c.job(job)}\n{_tail(log)}"
    )


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-4000:] if log.exists() else "(no output)"


def test_srun_two_tasks_equals_a_self_launched_run(cluster, reference, tmp_path):
    done = cluster.run(
        ["srun", "-n", "2", PY, SCRIPT, str(tmp_path / "w.pt"), str(tmp_path / "root")], timeout=300
    )
    assert "world=2" in done.stdout, done.stdout + done.stderr
    _equal(tmp_path / "w.pt", reference)


def test_a_batch_script_without_srun_self_launches_equal(cluster, reference, tmp_path):
    job, log = _submit(
        cluster, tmp_path, f"exec {PY} {SCRIPT} {tmp_path / 'w.pt'} {tmp_path / 'root'}", "-n", "1"
    )
    info = cluster.wait_job(job, ("COMPLETED", "FAILED", "CANCELLED"), 300)
    assert info["JobState"] == "COMPLETED", _tail(log)
    _equal(tmp_path / "w.pt", reference)


def test_tasks_per_node_unequal_to_devices_is_a_config_error(cluster, tmp_path):
    argv = ["srun", "-n", "2", PY, SCRIPT, str(tmp_path / "w.pt"), str(tmp_path / "root"), "--devices", "1"]
    done = cluster.run(argv, timeout=120, check=False)
    assert done.returncode != 0
    assert re.search(r"ConfigError: .*--ntasks-per-node=2.*devices=1", done.stderr), done.stderr[-3000:]


def _requeued_run(c: Slurm, tmp: Path, how: str, body: str, *options: str) -> tuple[str, int]:
    """Submit, wait for step 3, interrupt (`how`), start the requeued job, wait for it; (output, saved step)."""
    job, log = _submit(c, tmp, body, "--requeue", *options)
    _wait_for(log, r"STEP 3 ", 240, c, job)
    signalled = time.monotonic()
    if how == "scontrol requeue":
        c.run(["scontrol", "requeue", str(job)])
    elif how == "USR1 to the batch shell":
        c.run(["scancel", "-b", "-s", "USR1", str(job)])
    else:
        c.run(["scancel", "-s", "USR1", str(job)])
    left = _gone(tmp / "w.pt", signalled, 120)
    c.wait_job(job, ("PENDING",), 120, restarts=1)
    saved = int(_wait_for(log, r"stopping at global step (\d+)", 5, c, job).group(1))
    c.start_now(job)
    started = time.monotonic()
    _wait_for(log, rf"TRAIN_START step={saved} .*restarts=1", 240, c, job)
    resumed = time.monotonic() - started
    info = c.wait_job(job, ("COMPLETED", "FAILED", "CANCELLED"), 300)
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", (info, _tail(log))
    TIMES.setdefault(f"{how}: signal to every process gone", []).append(left)
    TIMES.setdefault(f"{how}: requeued job started to its first resumed step", []).append(resumed)
    return log.read_text(errors="replace"), saved


def _gone(marker: Path, since: float, timeout: float) -> float:
    """Seconds from `since` until no process of this test's run (its command names `marker`) is left."""
    needle = str(marker).encode()
    while time.monotonic() - since < timeout:
        alive = []
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                if needle in cmdline.read_bytes():
                    alive.append(cmdline)
            except OSError:
                continue
        if not alive:
            return time.monotonic() - since
        time.sleep(0.05)
    raise AssertionError(f"the run's processes were still alive {timeout:.0f} s after the signal")


def test_scontrol_requeue_mid_run_resumes_bit_identically(cluster, reference, tmp_path):
    body = f"srun {PY} {SCRIPT} {tmp_path / 'w.pt'} {tmp_path / 'root'} {' '.join(SLOW)}"
    out, saved = _requeued_run(cluster, tmp_path, "scontrol requeue", body, "--ntasks-per-node=2")
    assert "received SIGTERM: checkpointing" in out and 3 <= saved < 24, out[-3000:]
    assert re.search(rf"Restored from \S+last\.ckpt \(epoch \d+, step {saved}\)", out), out[-3000:]
    _equal(tmp_path / "w.pt", reference)


@pytest.mark.parametrize("start", ["srun", "batch script"])
def test_sigusr1_mid_run_requeues_and_resumes_bit_identically(cluster, reference, tmp_path, start):
    run = f"{PY} {SCRIPT} {tmp_path / 'w.pt'} {tmp_path / 'root'} {' '.join(SLOW)}"
    if start == "srun":
        out, saved = _requeued_run(cluster, tmp_path, "scancel -s USR1", f"srun {run}", "--ntasks-per-node=2")
    else:  # `exec python`: the launcher is the batch shell and passes the signal on to its workers
        out, saved = _requeued_run(cluster, tmp_path, "USR1 to the batch shell", f"exec {run}", "-n", "1")
        assert "launcher received SIGUSR1; passing it to the workers" in out, out[-3000:]
    assert "received SIGUSR1: checkpointing at the next step boundary, then requeueing" in out, out[-3000:]
    assert re.search(rf"stopping at global step {saved} after SIGUSR1; checkpoint saved", out), out[-3000:]
    assert "[tandem] requeued job" in out and 3 <= saved < 24, out[-3000:]
    assert re.search(rf"Restored from \S+last\.ckpt \(epoch \d+, step {saved}\)", out), out[-3000:]
    _equal(tmp_path / "w.pt", reference)


@pytest.mark.parametrize("start", ["srun", "batch script"])
def test_the_time_limit_warning_requeues_and_resumes_bit_identically(cluster, reference, tmp_path, start):
    """SLURM itself sends the warning: `--time=2 --signal=USR1@60` (to the steps; `B:` to the batch shell,
    which `exec python` makes Python). SLURM sends it up to a minute early (with `--time=1 --signal=USR1@50`
    it came 10-20 s into the job, too close to Python's start-up: a signal before fit installs its handler
    ends the process); here it comes 30-60 s in. The first attempt's 4 s steps cannot end in 2 minutes."""
    run = f"{PY} {SCRIPT} {tmp_path / 'w.pt'} {tmp_path / 'root'} --step-sleep 4 --first-attempt-slow"
    if start == "srun":
        body, options = f"srun {run}", ["--ntasks-per-node=2", "--signal=USR1@60"]
    else:
        body, options = f"exec {run}", ["-n", "1", "--signal=B:USR1@60"]
    job, log = _submit(cluster, tmp_path, body, "--requeue", "--time=2", *options)
    _wait_for(log, r"STEP 0 ", 120, cluster, job)
    started = time.monotonic()
    saved = int(_wait_for(log, r"stopping at global step (\d+) after SIGUSR1", 150, cluster, job).group(1))
    TIMES.setdefault(f"time-limit warning ({start}): first step to saved", []).append(
        time.monotonic() - started
    )
    cluster.wait_job(job, ("PENDING",), 60, restarts=1)
    cluster.start_now(job)
    info = cluster.wait_job(job, ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"), 180)
    out = _tail(log)
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", (info, out)
    assert "[tandem] requeued job" in out and 0 < saved < 24, out
    assert re.search(rf"Restored from \S+last\.ckpt \(epoch \d+, step {saved}\)", out), out
    _equal(tmp_path / "w.pt", reference)


def test_sigusr1_without_requeue_saves_exits_and_says_why(cluster, tmp_path):
    body = f"srun {PY} {SCRIPT} {tmp_path / 'w.pt'} {tmp_path / 'root'} {' '.join(SLOW)}"
    job, log = _submit(cluster, tmp_path, body, "--ntasks-per-node=2", "--no-requeue")
    _wait_for(log, r"STEP 3 ", 240, cluster, job)
    signalled = time.monotonic()
    cluster.run(["scancel", "-s", "USR1", str(job)])
    left = _gone(tmp_path / "w.pt", signalled, 120)
    info = cluster.wait_job(job, ("COMPLETED", "FAILED", "CANCELLED"), 120)
    TIMES.setdefault("USR1 without --requeue: signal to every process gone", []).append(left)
    out = _tail(log)
    assert info["Restarts"] == "0" and info["JobState"] == "FAILED", (info, out)
    saved = int(re.search(r"stopping at global step (\d+) after SIGUSR1", out).group(1))
    assert f"not requeued: job {job} may not be requeued" in out and "sbatch --requeue" in out, out
    ckpt = torch.load(tmp_path / "root" / "ckpts" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == saved and not (tmp_path / "w.pt").exists()


# ----- two nodes: a slurmd in each namespace of the network lab ----------------------------------------------
@pytest.fixture
def two_nodes() -> Iterator[Slurm]:
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    try:
        install()
    except SlurmError as e:
        pytest.skip(f"cannot install slurm-wlm on this machine: {e}")
    labs = lab_fixture()  # holds the lab lock until the lab is gone; skips where no lab can be built
    lab = next(labs)
    cluster = None
    try:
        nodes = [(f"tandem-n{i}", lab.addr(i), lab.ns(i)) for i in (0, 1)]
        try:
            cluster = Slurm.start(nodes, port=7017)
        except SlurmError as e:
            pytest.fail(f"SLURM in the network lab did not start: {e}")
        cluster.lab = lab
        yield cluster
    finally:
        if cluster is not None:
            cluster.down()
        labs.close()


def test_a_two_node_job_in_the_lab_equals_a_one_node_two_task_job(two_nodes, reference, tmp_path):
    body = f"srun {PY} {SCRIPT} {tmp_path / 'w.pt'} {tmp_path / 'root'} --devices 1 --num-nodes 2"
    before = link_bytes(two_nodes.lab, 1)
    job, log = _submit(two_nodes, tmp_path, body, "-N", "2", "--ntasks-per-node=1")
    info = two_nodes.wait_job(job, ("COMPLETED", "FAILED", "CANCELLED"), 300)
    assert info["JobState"] == "COMPLETED" and info["NodeList"] == "tandem-n[0-1]", (info, _tail(log))
    assert "world=2" in _tail(log)
    rx, tx = (after - b for after, b in zip(link_bytes(two_nodes.lab, 1), before))
    assert rx > 20_000 and tx > 20_000, (rx, tx)  # the gradients crossed the lab's link both ways
    _equal(tmp_path / "w.pt", reference)
