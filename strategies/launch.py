"""Starting DDP workers: join torchrun/SLURM when present, else re-run this command through torch's
elastic launcher (torch.distributed.launcher.api) and exit with the workers' status."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
import uuid
from dataclasses import dataclass
from typing import Any, NoReturn

from strategies import slurm
from tandem_core.errors import ConfigError

_RANK_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
# a worker's exit status after Ctrl-C: 130 after the agreed stop (trainer/loop/signals.py), -SIGINT when a
# second Ctrl-C's KeyboardInterrupt ended it (Python exits by the signal then)
INTERRUPTED = (128 + int(signal.SIGINT), -int(signal.SIGINT))


@dataclass(frozen=True)
class Launcher:
    """How a strategy starts its workers (Lightning's ``strategy.launcher``): `start_method` is 'popen' (the
    script re-run once per device; forked instead in a notebook), 'fork', 'spawn' or 'forkserver';
    `is_interactive_compatible` says whether it runs from a notebook."""

    start_method: str
    is_interactive_compatible: bool


def adopt_slurm_env() -> bool:
    """In a task that srun started, translate SLURM_* into torch's RANK/WORLD_SIZE/... True if it did."""
    return slurm.adopt()


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


def _handle_repeated_signals() -> None:
    """The elastic agent turns each signal into an exception; a second one would abort its wait for the
    workers' checkpoint and leave them behind. Act on the first only; a second Ctrl-C is passed to the workers,
    which then stop at once (as a second Ctrl-C does to a single process), while this keeps waiting."""
    from torch.distributed.elastic.multiprocessing import api

    first = getattr(api, "_terminate_process_handler", None)
    if first is None or getattr(first, "_tandem", False):
        return
    received: list[int] = []

    def handler(signum: int, frame: Any) -> None:
        if received and signum == signal.SIGTERM:
            os.write(2, b"[tandem] launcher received SIGTERM again; still waiting for the workers to stop\n")
            return
        if received and signum == signal.SIGINT:
            os.write(2, b"[tandem] launcher: Ctrl-C again; the workers stop at once\n")
            for pid in _worker_pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGINT)
            return
        received.append(signum)
        first(signum, frame)

    handler._tandem = True  # type: ignore[attr-defined]
    api._terminate_process_handler = handler  # looked up when the agent installs its handlers


def _worker_pids() -> list[int]:
    """This process's children: the workers the elastic agent started (it runs in this process)."""
    me, pids = os.getpid(), []
    for stat in os.listdir("/proc"):
        if stat.isdigit():
            try:
                with open(f"/proc/{stat}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == me:
                        pids.append(int(stat))
            except (OSError, ValueError, IndexError):
                continue  # gone meanwhile
    return pids


def _forward_user_signals() -> list[int]:
    """SIGUSR1/SIGUSR2 (SLURM's time-limit warning, --signal=B:USR1@90) reach the launcher only when it is
    the batch script's process; torch's agent would die of them and leave the workers behind. Pass them on
    once each: the workers checkpoint and, under SLURM, requeue the job. The signals received, in order."""
    received: list[int] = []

    def forward(signum: int, frame: Any) -> None:
        first = signum not in received
        received.append(signum)
        if first:
            name = signal.Signals(signum).name
            os.write(2, f"[tandem] launcher received {name}; passing it to the workers\n".encode())
            for pid in _worker_pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signum)

    for signum in (signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(signum, forward)
    return received


def _batch_shell_note(nprocs: int) -> None:
    """Started by a SLURM batch script's shell (no exec, no srun): signals for the job reach only that shell."""
    try:
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
            parent = f.read()
    except OSError:
        return
    if b"slurm_script" in parent:
        print(
            f"[tandem] a SLURM batch script runs python without srun: this process starts the {nprocs} workers "
            "itself. A signal for the job (--signal=B:USR1@90, scancel -b) reaches the batch shell, which dies "
            "of it and ends the job before anything is saved: start python with `exec python ...` in the batch "
            f"script, or use srun (#SBATCH --ntasks-per-node={nprocs} --signal=USR1@90; srun python ...).",
            file=sys.stderr,
            flush=True,
        )


def _not_an_interrupt(record: logging.LogRecord) -> bool:
    """False for torch's "failed (exitcode: 130 or -2)" record of a worker that Ctrl-C stopped."""
    text = str(record.msg)
    return not (text.startswith("failed (exitcode") and record.args and record.args[0] in INTERRUPTED)  # type: ignore[index]


def relaunch(nprocs: int, max_restarts: int = 0) -> NoReturn:
    """Run this command as `nprocs` workers on this machine; exit with their status."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    for name in ("torch.distributed.elastic", "torch.distributed.launcher"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # torch's agent logs an interrupted worker as "failed (exitcode: 130)"; this launcher reports it as the
    # interrupt it is (below), and a real failure is still logged
    logging.getLogger("torch.distributed.elastic.multiprocessing.api").addFilter(_not_an_interrupt)
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
    _handle_repeated_signals()
    forwarded = _forward_user_signals()
    if slurm.in_batch_script():
        _batch_shell_note(nprocs)
    try:
        elastic_launch(config, sys.executable)(*_command())
    except SignalException as e:  # this launcher was signalled; the workers got it too and checkpointed
        what = "interrupted (Ctrl-C)" if e.sigval == signal.SIGINT else f"received {e.sigval.name}"
        print(f"[tandem] launcher {what}; workers stopped.", file=sys.stderr)
        sys.exit(128 + int(e.sigval))
    except ChildFailedError as e:
        rank, failure = e.get_first_failure()
        stopped = [s for s in forwarded if failure.exitcode == 128 + s]
        if stopped:  # the workers acted on the signal passed on (and said so): no failure
            print(f"[tandem] workers stopped after {signal.Signals(stopped[0]).name}.", file=sys.stderr)
            sys.exit(failure.exitcode)
        if failure.exitcode in INTERRUPTED:  # Ctrl-C reached a worker (its own os.kill, a terminal's group)
            how = "at once (a second Ctrl-C)" if failure.exitcode < 0 else "at the step they agreed on"
            print(f"[tandem] interrupted: the workers stopped {how} after SIGINT (rank {rank} first).",
                  file=sys.stderr)  # fmt: skip
            sys.exit(128 + int(signal.SIGINT))
        print(
            f"[tandem] worker rank {rank} failed with exit code {failure.exitcode}; its traceback is printed "
            "above. The other workers were stopped.",
            file=sys.stderr,
        )
        sys.exit(failure.exitcode if isinstance(failure.exitcode, int) and failure.exitcode > 0 else 1)
    sys.exit(0)
