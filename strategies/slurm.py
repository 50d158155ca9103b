"""SLURM: what kind of process this is (a task that srun started, the batch script itself, or a process
in an interactive allocation), its ranks from SLURM_*, and the checks of a job's shape against the Trainer.

A task of an srun step has SLURM_STEP_ID; the batch script (and what it starts without srun) has
SLURM_JOB_ID but no SLURM_STEP_ID. Jobs named "bash" or "interactive" (`srun --pty bash`, salloc) are
treated as interactive: their processes are started by hand, as on a workstation.
"""

from __future__ import annotations

import os
import re

from tandem_core.errors import ConfigError, DistributedError

INTERACTIVE_NAMES = ("bash", "interactive")
_COUNT = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")
_adopted = False  # this process took its ranks from srun's variables (see adopt)


def interactive() -> bool:
    """A SLURM allocation used by hand (`srun --pty bash`, job name 'bash' or 'interactive')."""
    return os.environ.get("SLURM_JOB_NAME") in INTERACTIVE_NAMES


def in_job() -> bool:
    """This process belongs to a SLURM job (batch script or srun task), not an interactive one."""
    return "SLURM_JOB_ID" in os.environ and not interactive()


def in_step() -> bool:
    """This process is one task of an srun step (srun set its SLURM_PROCID and SLURM_STEP_ID)."""
    return in_job() and "SLURM_STEP_ID" in os.environ and "SLURM_PROCID" in os.environ


def in_batch_script() -> bool:
    """This process runs inside a batch script without srun: one process, whatever --ntasks says."""
    return in_job() and "SLURM_STEP_ID" not in os.environ


def job_id() -> str | None:
    return os.environ.get("SLURM_JOB_ID")


def first_host(nodelist: str) -> str:
    """'node[01-04,07],gpu2' -> 'node01' (the first host, without calling scontrol)."""
    head = nodelist.split(",")[0]
    if "[" in head:
        prefix, rest = head.split("[", 1)
        return prefix + rest.split("-")[0].split(",")[0].rstrip("]")
    return head


def expand_counts(text: str) -> list[int]:
    """SLURM's per-node counts, '2(x3),1' -> [2, 2, 2, 1]."""
    counts: list[int] = []
    for part in text.split(","):
        m = _COUNT.match(part.strip())
        if m is None:
            raise ConfigError(f"cannot read SLURM's tasks per node {text!r} (expected e.g. '2(x3),1')")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts


def tasks_on_this_node() -> int:
    """How many tasks of this srun step run on this node."""
    env = os.environ
    counts = expand_counts(env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE", "1"))
    node = int(env.get("SLURM_NODEID", "0"))
    return counts[node] if node < len(counts) else counts[-1]


def adopt() -> bool:
    """In an srun task, translate SLURM_* into torch's RANK/WORLD_SIZE/... (unless set). True if it did."""
    global _adopted
    env = os.environ
    if not in_step() or "RANK" in env:
        return False
    _adopted = True
    env["RANK"] = env["SLURM_PROCID"]
    env["WORLD_SIZE"] = env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS", "1")
    env["LOCAL_RANK"] = env.get("SLURM_LOCALID", "0")
    env["LOCAL_WORLD_SIZE"] = str(tasks_on_this_node())
    env.setdefault(
        "MASTER_ADDR", first_host(env.get("SLURM_STEP_NODELIST") or env.get("SLURM_NODELIST", "127.0.0.1"))
    )
    if "MASTER_PORT" not in env:
        env["MASTER_PORT"] = str(15000 + int(job_number()) % 20000)
    return True


def job_number() -> str:
    """SLURM_JOB_ID, checked to be a job number (it reaches a port and scontrol's command line)."""
    job = os.environ.get("SLURM_JOB_ID", "0")
    if not re.fullmatch(r"\d+", job):
        raise DistributedError(
            f"SLURM_JOB_ID={job[:64]!r} is not a SLURM job number (digits only): run under a real SLURM "
            "job, or unset SLURM_JOB_ID / set MASTER_PORT yourself"
        )
    return job


def adopted() -> bool:
    """True once `adopt` gave this process its ranks from srun's variables."""
    return _adopted


def check_step(devices: int, num_nodes: int) -> None:
    """An srun step's shape must be the Trainer's: tasks on this node == devices, nodes == num_nodes."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE") or tasks_on_this_node())
    if local != devices:
        raise ConfigError(
            f"this SLURM job step runs {local} task(s) on this node (--ntasks-per-node={local}) but the Trainer "
            f"has devices={devices}: make them agree, one task per device: `#SBATCH --ntasks-per-node={devices}` "
            f"(or `srun -n {devices * num_nodes}`), or Trainer(devices={local})."
        )
    nodes = int(os.environ.get("SLURM_STEP_NUM_NODES") or os.environ.get("SLURM_NNODES", "1"))
    if nodes != num_nodes:
        raise ConfigError(
            f"this SLURM job step spans {nodes} node(s) (--nodes={nodes}) but the Trainer has num_nodes="
            f"{num_nodes}: make them agree (`#SBATCH --nodes={num_nodes}`, or Trainer(num_nodes={nodes}))."
        )


def check_batch_script(devices: int, num_nodes: int) -> None:
    """The batch script itself runs python (no srun): fine on one node, where this process starts `devices`
    workers itself; several nodes, or several tasks per node other than `devices`, need srun."""
    env = os.environ
    nodes = int(env.get("SLURM_NNODES", "1"))
    if nodes > 1 or num_nodes > 1:
        raise ConfigError(
            f"this SLURM job has {nodes} node(s) and the Trainer num_nodes={num_nodes}, but python was started by "
            "the batch script without srun, so it runs on the first node only: start it with "
            f"`srun python {_script()}` and `#SBATCH --ntasks-per-node={devices}` (one task per device)."
        )
    per_node = int(env.get("SLURM_NTASKS_PER_NODE", "1"))
    if per_node > 1 and per_node != devices:
        raise ConfigError(
            f"this SLURM job asks for --ntasks-per-node={per_node} but the Trainer has devices={devices}: make "
            f"them agree, and start the tasks with `srun python {_script()}` (one task per device)."
        )


def _script() -> str:
    import sys

    return " ".join(sys.argv) if sys.argv and sys.argv[0] else "train.py"
