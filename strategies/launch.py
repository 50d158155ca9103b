"""Starting DDP workers: join torchrun/SLURM when present, else re-run this command through torch's
elastic launcher (torch.distributed.launcher.api) and exit with the workers' status."""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import uuid
from typing import Any, NoReturn

from trainer.errors import ConfigError

_RANK_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def _first_slurm_host(nodelist: str) -> str:
    """'node[01-04,07],gpu2' -> 'node01' (the first host, without calling scontrol)."""
    head = nodelist.split(",")[0]
    if "[" in head:
        prefix, rest = head.split("[", 1)
        return prefix + rest.split("-")[0].split(",")[0].rstrip("]")
    return head


def adopt_slurm_env() -> bool:
    """Under `srun`, translate SLURM_* into torch's RANK/WORLD_SIZE/... variables. True if it did."""
    if "SLURM_PROCID" not in os.environ or "SLURM_NTASKS" not in os.environ or "RANK" in os.environ:
        return False
    if os.environ.get("SLURM_JOB_NAME") in ("bash", "interactive"):
        return False  # an interactive allocation: the user runs the script by hand, not one task per rank
    env = os.environ
    env["RANK"] = env["SLURM_PROCID"]
    env["WORLD_SIZE"] = env["SLURM_NTASKS"]
    env["LOCAL_RANK"] = env.get("SLURM_LOCALID", "0")
    env.setdefault("MASTER_ADDR", _first_slurm_host(env.get("SLURM_NODELIST", "127.0.0.1")))
    env.setdefault("MASTER_PORT", str(15000 + int(env.get("SLURM_JOB_ID", "0")) % 20000))
    return True


def launched_externally() -> bool:
    """True inside a worker of torchrun, of our own launcher, or of SLURM."""
    return adopt_slurm_env() or all(v in os.environ for v in _RANK_VARS)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _command() -> list[str]:
    """The arguments that re-run this program: the script, or `-m module`, and its arguments."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name not in ("__main__", None):
        name = spec.name[: -len(".__main__")] if spec.name.endswith(".__main__") else spec.name
        return ["-u", "-m", name, *sys.argv[1:]]
    if not sys.argv or not sys.argv[0] or sys.argv[0] in ("-c", "-"):
        raise ConfigError(
            "strategy='ddp' with devices > 1 re-runs your script once per process, but this program has no "
            "script file (python -c or an interactive session). Put the code in a .py file, or run it "
            "with torchrun --nproc_per_node=N script.py."
        )
    return ["-u", os.path.abspath(sys.argv[0]), *sys.argv[1:]]


def _ignore_repeated_sigterm() -> None:
    """The elastic agent turns each signal into an exception; a second SIGTERM (a scheduler that repeats it)
    would abort its wait for the workers' checkpoint and leave them behind. Act on the first only."""
    from torch.distributed.elastic.multiprocessing import api

    first = getattr(api, "_terminate_process_handler", None)
    if first is None or getattr(first, "_tandem", False):
        return
    received: list[int] = []

    def handler(signum: int, frame: Any) -> None:
        if received and signum == signal.SIGTERM:
            os.write(2, b"[tandem] launcher received SIGTERM again; still waiting for the workers to stop\n")
            return
        received.append(signum)
        first(signum, frame)

    handler._tandem = True  # type: ignore[attr-defined]
    api._terminate_process_handler = handler  # looked up when the agent installs its handlers


def relaunch(nprocs: int, max_restarts: int = 0) -> NoReturn:
    """Run this command as `nprocs` workers on this machine; exit with their status."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    for name in ("torch.distributed.elastic", "torch.distributed.launcher"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # Like torchrun: one intra-op thread per worker unless told otherwise, so workers do not oversubscribe.
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nprocs)))
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nprocs,
        run_id=str(uuid.uuid4()),
        rdzv_backend="c10d",
        rdzv_endpoint=f"127.0.0.1:{_free_port()}",
        max_restarts=max_restarts,
        monitor_interval=0.1,
        # grace between SIGTERM and SIGKILL when this launcher is signalled: room for the workers to reach
        # their agreed stop and checkpoint (torch 2.13 applies its fixed 30 s when a worker fails instead)
        shutdown_timeout=50,
    )
    _ignore_repeated_sigterm()
    try:
        elastic_launch(config, sys.executable)(*_command())
    except SignalException as e:  # this launcher was signalled; the workers got it too and checkpointed
        print(f"[tandem] launcher received {e.sigval.name}; workers stopped.", file=sys.stderr)
        sys.exit(128 + int(e.sigval))
    except ChildFailedError as e:
        rank, failure = e.get_first_failure()
        print(
            f"[tandem] worker rank {rank} failed with exit code {failure.exitcode}; its traceback is printed "
            "above. The other workers were stopped.",
            file=sys.stderr,
        )
        sys.exit(failure.exitcode if isinstance(failure.exitcode, int) and failure.exitcode > 0 else 1)
    sys.exit(0)
