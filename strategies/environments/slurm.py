"""SLURMEnvironment: Lightning's name for how a job runs under SLURM, and where its requeue is configured.

    from trainer.plugins.environments import SLURMEnvironment     # lightning.pytorch.plugins.environments
    Trainer(plugins=[SLURMEnvironment(auto_requeue=True, requeue_signal=signal.SIGUSR1)])

Under SLURM Tandem uses ``SLURMEnvironment()`` without being asked (as Lightning does): the requeue signal
(SIGUSR1 unless told otherwise; send it before the time limit with ``#SBATCH --signal=USR1@90``) makes every
rank stop at the next step boundary they agree on, save a checkpoint, and exit; rank 0 then runs
``scontrol requeue $SLURM_JOB_ID`` when the job may be requeued (and says why not otherwise). The requeued
job resumes from that checkpoint with ``Trainer(resume="auto")``. With ``auto_requeue=False`` the signal
still saves and stops, without the requeue. SIGTERM keeps its meaning: save, stop, no requeue (SLURM sends it
on ``scancel``, preemption and ``scontrol requeue``, and requeues the job itself when it should be).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess

from strategies import slurm
from strategies.environments.base import ClusterEnvironment, export
from tandem_core.errors import ConfigError

__all__ = ["SLURMEnvironment"]


class SLURMEnvironment(ClusterEnvironment):
    """The job runs under SLURM; `auto_requeue` and `requeue_signal` as in Lightning (SIGUSR1 by default).

    Its processes are srun's tasks (`creates_processes_externally`), except the batch script's own process run
    without srun: there Tandem starts the workers itself on this node (Lightning would wait for tasks that never
    come)."""

    def __init__(self, auto_requeue: bool = True, requeue_signal: signal.Signals | int | None = None) -> None:
        if not isinstance(auto_requeue, bool):
            raise ConfigError(
                f"SLURMEnvironment(auto_requeue=...) must be True or False, got {auto_requeue!r}"
            )
        if requeue_signal is None:
            requeue_signal = signal.SIGUSR1
        try:
            requeue_signal = signal.Signals(requeue_signal)
        except (ValueError, TypeError):
            raise ConfigError(
                f"SLURMEnvironment(requeue_signal={requeue_signal!r}) must be a signal, e.g. signal.SIGUSR1"
            ) from None
        if requeue_signal in (signal.SIGTERM, signal.SIGINT, signal.SIGKILL, signal.SIGSTOP):
            raise ConfigError(
                f"SLURMEnvironment(requeue_signal={requeue_signal.name}): SIGTERM and SIGINT already save and stop "
                "without a requeue (SIGKILL and SIGSTOP cannot be caught); use SIGUSR1 or SIGUSR2 and "
                "`#SBATCH --signal=USR1@90`."
            )
        self.auto_requeue, self.requeue_signal = auto_requeue, requeue_signal

    def __repr__(self) -> str:
        return (
            f"SLURMEnvironment(auto_requeue={self.auto_requeue}, requeue_signal={self.requeue_signal.name})"
        )

    # ----- Lightning's ClusterEnvironment interface -------------------------------------------------
    @property
    def creates_processes_externally(self) -> bool:
        """True in srun's tasks; False in the batch script's own process (no srun: Tandem starts the workers)."""
        return not slurm.in_batch_script()

    @property
    def main_address(self) -> str:
        return os.environ.get("MASTER_ADDR") or slurm.first_host(
            os.environ.get("SLURM_NODELIST", "127.0.0.1")
        )

    @property
    def main_port(self) -> int:
        return int(os.environ.get("MASTER_PORT") or 15000 + int(os.environ.get("SLURM_JOB_ID", "0")) % 20000)

    @staticmethod
    def detect() -> bool:
        """True in a SLURM job (SLURM_JOB_ID, or srun's SLURM_NTASKS) that is not an interactive one (job name
        'bash' or 'interactive')."""
        return slurm.in_job() or ("SLURM_NTASKS" in os.environ and not slurm.interactive())

    @staticmethod
    def job_name() -> str | None:
        """The job's name (SLURM_JOB_NAME)."""
        return os.environ.get("SLURM_JOB_NAME")

    @staticmethod
    def job_id() -> int | None:
        """The job's number, None outside a job or in an interactive one."""
        job = os.environ.get("SLURM_JOB_ID")
        return int(job) if job is not None and job.isdigit() and not slurm.interactive() else None

    def world_size(self) -> int:
        return int(os.environ.get("SLURM_STEP_NUM_TASKS") or os.environ.get("SLURM_NTASKS", "1"))

    def set_world_size(self, size: int) -> None:
        """SLURM says the job's size (srun's tasks); ignored."""

    def set_global_rank(self, rank: int) -> None:
        """SLURM says each task's rank (SLURM_PROCID); ignored."""

    def global_rank(self) -> int:
        return int(os.environ.get("SLURM_PROCID", "0"))

    def local_rank(self) -> int:
        return int(os.environ.get("SLURM_LOCALID", "0"))

    def node_rank(self) -> int:
        return int(os.environ.get("SLURM_NODEID", "0"))

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        """A ConfigError when the srun step's tasks per node or nodes differ from devices / num_nodes."""
        if slurm.in_step():
            slurm.check_step(num_devices, num_nodes)

    @staticmethod
    def resolve_root_node_address(nodes: str) -> str:
        """The first host of a SLURM node list ('node[01-04],gpu2' -> 'node01')."""
        return slurm.first_host(nodes)

    def export_variables(self) -> None:
        """torch.distributed's variables from srun's (strategies/slurm.py: this node's task count, the port
        from the job number), else from this environment's answers."""
        if not slurm.adopt():
            export(self)

    # ----- the requeue --------------------------------------------------------------------------
    def requeue(self) -> tuple[bool, str]:
        """Requeue this job (`scontrol requeue`); (done, what happened, said to the user)."""
        job = os.environ.get("SLURM_JOB_ID")
        if not self.auto_requeue:
            return False, "not requeued: SLURMEnvironment(auto_requeue=False)"
        if job is None:
            return False, "not requeued: this process is not part of a SLURM job (no SLURM_JOB_ID)"
        if not re.fullmatch(r"\d+", job):  # never passed to scontrol's command line
            return False, (
                f"not requeued: SLURM_JOB_ID={job[:64]!r} is not a job number (digits only); requeue the "
                "job by hand with `scontrol requeue <job id>`"
            )
        if shutil.which("scontrol") is None:
            return (
                False,
                f"not requeued: `scontrol` is not on PATH; requeue job {job} by hand (scontrol requeue {job})",
            )
        info, problem = _show_job(job)
        if problem:
            return False, f"not requeued: {problem}"
        if info.get("BatchFlag") == "0":
            return False, (
                f"not requeued: job {job} is not a batch job (salloc or a bare srun), and SLURM requeues batch jobs "
                "only: submit the script with sbatch"
            )
        if info.get("Requeue") != "1":
            return False, (
                f"not requeued: job {job} may not be requeued (`scontrol show job {job}`: Requeue=0). Submit it with "
                "`sbatch --requeue` (`#SBATCH --requeue`); where slurm.conf sets JobRequeue=0 every job needs that, "
                "and a job submitted with --no-requeue never is"
            )
        done = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, timeout=60)
        if done.returncode < 0 and _requeued(job, info):  # the requeue stopped this job's steps, scontrol too
            return True, f"requeued job {job} (scontrol requeue {job}, which the requeue itself then stopped)"
        if done.returncode != 0:
            return False, f"`scontrol requeue {job}` failed ({done.returncode}): {done.stderr.strip()}"
        return True, f"requeued job {job} (scontrol requeue {job})"


def _requeued(job: str, before: dict[str, str]) -> bool:
    """Whether SLURM took the requeue: the job counts one more restart, or waits to run again."""
    after, problem = _show_job(job)
    if problem:
        return False
    state = after.get("JobState", "")
    return after.get("Restarts") != before.get("Restarts") or state.startswith(("REQUEUE", "PENDING"))


def _show_job(job: str) -> tuple[dict[str, str], str | None]:
    """`scontrol show job` as a dict, or why it could not be read."""
    try:
        done = subprocess.run(
            ["scontrol", "-o", "show", "job", job], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return {}, f"`scontrol show job {job}` failed: {e}"
    if done.returncode != 0:
        return {}, f"`scontrol show job {job}` failed ({done.returncode}): {done.stderr.strip()}"
    return dict(re.findall(r"(\w+)=(\S*)", done.stdout)), None


def environment_of(plugins: object) -> SLURMEnvironment | None:
    """The SLURMEnvironment a run uses: the one in `plugins`, else a default one inside a SLURM job."""
    for p in plugins if isinstance(plugins, (list, tuple)) else [plugins]:
        if isinstance(p, SLURMEnvironment):
            return p
    return SLURMEnvironment() if slurm.in_job() else None
