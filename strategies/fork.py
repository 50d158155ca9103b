"""Workers started from this process: fork for notebooks and interactive sessions (Lightning's `ddp_notebook` /
`ddp_fork`), spawn or forkserver for Lightning's `ddp_spawn` (what users' own pytest suites use).

A Jupyter kernel has no script that the usual start could re-run once per device, so the stage (fit,
validate, test, predict) runs in `devices` processes started from this one: forked, each inherits the task,
the data and the Trainer as they are; spawned, each receives them pickled (by value: no tensor is shared
between the processes). Each joins a gloo/NCCL group on 127.0.0.1 and runs the stage; rank 0 sends back
what a script's process would hold afterwards (the weights, the loop state, the metrics, the callbacks'
state, the loggers' versions, the stage's return value) and this process takes it over.

Forked workers run one intra-op thread each: OpenMP's thread pool does not survive fork(), and a forked
worker that asked for more threads than one hung in its first parallel region here (torch 2.13, GNU OpenMP).
A script's workers get OMP_NUM_THREADS = cores // devices, so on a machine with more cores than devices the
last bits of some CPU kernels can differ between the two starts.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import signal
import sys
import time
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from tandem_core.errors import ConfigError, DistributedError

if TYPE_CHECKING:
    from strategies.process_group import ProcessGroupStrategy
    from trainer.task.base import Task
    from trainer.trainer import Trainer

GRACE_S = 30.0  # after a worker failed or Ctrl-C: how long the others get to stop before SIGKILL


def interactive() -> bool:
    """A notebook, IPython or `python -i`: no script that a self-launch could re-run."""
    main = sys.modules.get("__main__")
    no_script = getattr(main, "__file__", None) is None and getattr(main, "__spec__", None) is None
    return hasattr(sys, "ps1") or bool(sys.flags.interactive) or no_script


def check_forkable(strategy_name: str) -> None:
    """Refuse at once what a forked worker could not do."""
    if "fork" not in mp.get_all_start_methods():
        raise ConfigError(
            f"strategy={strategy_name!r} starts its workers with fork(), which this platform lacks: put the code "
            "in a script and run `python train.py` (strategy='ddp'), or use strategy='dp' here."
        )
    # (is_initialized only: is_available() itself would initialize CUDA here without NVML's check, which
    # tandem_core sets up at import)
    if torch.cuda.is_initialized():
        raise ConfigError(
            "CUDA was initialized in this process before the workers were forked, and a forked process cannot "
            "use it: restart the kernel and call fit() before anything touches CUDA (no .cuda() or "
            "torch.cuda calls), or run a script (`python train.py`, strategy='ddp')."
        )
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        raise ConfigError(
            "this process already belongs to a process group, so it cannot fork workers that start their own: "
            "run the notebook's code in a fresh kernel."
        )


class ForkStart:
    """Returned by ProcessGroupStrategy.launch() in the parent: `run` makes the workers run a stage."""

    def __init__(self, strategy: ProcessGroupStrategy, nprocs: int, method: str = "fork") -> None:
        self.strategy, self.nprocs, self.method = strategy, nprocs, method

    def run(self, trainer: Trainer, task: Task | None, stage: Callable[[], Any]) -> Any:
        """Run `stage` in `nprocs` workers (forked, or spawned with the trainer and stage pickled); take over
        rank 0's results; return the stage's value."""
        from strategies.launch import _free_port

        ctx = mp.get_context(self.method)
        # one pipe per worker: rank 0's report is larger than a pipe's atomic write, and two workers writing
        # to one pipe at once interleaved their bytes (UnpicklingError in the notebook)
        pipes = [ctx.Pipe(duplex=False) for _ in range(self.nprocs)]
        sends = [send for _, send in pipes]
        port = _free_port()
        if self.method == "fork":
            target, common = self._worker, (trainer, stage, sends)
            args = [(rank, port, *common) for rank in range(self.nprocs)]
        else:  # the worker imports this module afresh and unpickles what it runs (plain pickle: by value)
            payload = self._pickled(trainer, stage)
            target, args = _spawned, [(payload, rank, port, sends[rank]) for rank in range(self.nprocs)]
        workers = [
            ctx.Process(target=target, args=args[rank], name=f"tandem-rank{rank}")
            for rank in range(self.nprocs)
        ]
        for w in workers:
            w.start()
        for send in sends:
            send.close()
        try:
            reports = _wait(workers, [receive for receive, _ in pipes])
        except KeyboardInterrupt:  # the notebook's interrupt: each worker checkpoints and stops, as on Ctrl-C
            _stop(workers, signal.SIGINT)
            raise
        finally:
            for receive, _ in pipes:
                receive.close()
        return _take_over(trainer, task, reports)

    def _pickled(self, trainer: Trainer, stage: Callable[[], Any]) -> bytes:
        """This start, the trainer (with its strategy, callbacks, loggers) and the stage with its task and data,
        pickled together (one pickle keeps the objects they share shared)."""
        try:
            return pickle.dumps((self, trainer, stage))
        except Exception as e:  # noqa: BLE001 (anything unpicklable: say what and how to avoid it)
            raise ConfigError(
                f"strategy='ddp_{self.method}' sends the trainer, the task and the data to its workers by "
                f"pickling, and one of them cannot be pickled ({type(e).__name__}: {e}). Define the task, its "
                "data and callbacks at module level (no lambdas or local classes), or use strategy='ddp' (runs "
                "the script once per device: nothing is pickled) or 'ddp_fork'."
            ) from e

    def _worker(
        self, rank: int, port: int, trainer: Trainer, stage: Callable[[], Any], sends: list[Any]
    ) -> None:
        for other, conn in enumerate(sends):
            if other != rank:
                conn.close()
        self._work(rank, port, trainer, stage, sends[rank])

    def _work(self, rank: int, port: int, trainer: Trainer, stage: Callable[[], Any], send: Any) -> None:
        n = str(self.nprocs)
        os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=n, LOCAL_WORLD_SIZE=n)
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        # a forked worker runs one thread (see the module's docstring); a spawned one starts a fresh pool
        torch.set_num_threads(1 if self.method == "fork" else max(1, (os.cpu_count() or 1) // self.nprocs))
        try:
            self.strategy._join_group()
            value = stage()
            report = ("ok", rank, _results(trainer, value) if rank == 0 else None)
        except SystemExit as e:  # a stop signal: checkpointed, then exits 128 + signal
            report = ("exit", rank, e.code)
        except BaseException as e:  # noqa: BLE001 (every failure goes back to the notebook)
            report = ("error", rank, (_picklable(e), traceback.format_exc()))
        sys.stdout.flush()
        sys.stderr.flush()
        send.send_bytes(pickle.dumps(report))  # plain bytes: torch's pickler would share tensors by fd,
        send.close()  # which this worker could not serve after it exits
        os._exit(0 if report[0] == "ok" else 1)  # no interpreter shutdown: the parent's atexit is not ours


def _spawned(payload: bytes, rank: int, port: int, send: Any) -> None:
    """A spawned worker's entry point: unpickle the start, the trainer and the stage, then run as a fork does."""
    start, trainer, stage = pickle.loads(payload)
    start._work(rank, port, trainer, stage, send)


def _wait(workers: list[Any], receivers: list[Any]) -> dict[int, tuple[str, Any]]:
    """Every worker's report (one pipe each); the first failure stops the others and is raised here."""
    reports: dict[int, tuple[str, Any]] = {}
    while len(reports) < len(workers):
        ready = [r for r, conn in enumerate(receivers) if r not in reports and conn.poll(0.05)]
        for r in ready:
            try:
                kind, rank, payload = pickle.loads(receivers[r].recv_bytes())
            except EOFError:
                kind, rank, payload = "error", r, None
            if kind != "ok":
                _stop(workers, signal.SIGTERM)
                _raise(kind, rank, payload, workers)
            reports[rank] = (kind, payload)
        if ready:
            continue
        dead = [(r, w.exitcode) for r, w in enumerate(workers) if r not in reports and w.exitcode is not None]
        if dead and not receivers[dead[0][0]].poll(0.5):  # gone without a report (killed): none can come now
            _stop(workers, signal.SIGTERM)
            rank, code = dead[0]
            raise DistributedError(
                f"worker rank {rank} died with exit code {code} before reporting (killed, or out of "
                "memory); the other workers were stopped."
            )
    for w in workers:
        w.join()
    return reports


def _stop(workers: list[Any], signum: int) -> None:
    """Signal the workers still running, give them GRACE_S to stop, then SIGKILL what is left."""
    for w in workers:
        if w.exitcode is None and w.pid is not None:
            try:
                os.kill(w.pid, signum)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + GRACE_S
    for w in workers:
        w.join(max(0.0, deadline - time.monotonic()))
        if w.exitcode is None:
            w.kill()
            w.join()


def _raise(kind: str, rank: int, payload: Any, workers: list[Any]) -> None:
    if kind == "exit":  # a stop signal in the workers (they saved their checkpoint and said so)
        raise SystemExit(payload)
    if payload is None:
        raise DistributedError("a worker ended without sending its result; the others were stopped.")
    error, text = payload
    remote = _RemoteTraceback(f"\n\nworker rank {rank} failed:\n\n{text}")
    if isinstance(error, BaseException):
        raise error from remote
    raise DistributedError(f"worker rank {rank} failed: {error}") from remote


class _RemoteTraceback(Exception):
    """The traceback of a worker's exception, shown as the cause of the one raised here."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return self.text


def _picklable(e: BaseException) -> BaseException | str:
    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:  # noqa: BLE001 (an exception class that cannot travel: send its text)
        return f"{type(e).__name__}: {e}"


def _results(t: Trainer, value: Any) -> dict[str, Any]:
    """What rank 0's process holds after the stage, as plain data (tensors moved to the CPU)."""
    task = t.task
    cpu = {k: v.detach().cpu() for k, v in t.callback_metrics.items()}
    return {
        "weights": None if task is None else {k: v.detach().cpu() for k, v in task.state_dict().items()},
        "state": t.state,
        "callback_metrics": cpu,
        "logged_metrics": dict(t.logged_metrics),
        "callbacks": {cb.state_key: (getattr(cb, "dirpath", None), cb.state_dict()) for cb in t.callbacks},
        "versions": [lg._version for lg in t.loggers],
        "value": value,
    }


def _take_over(t: Trainer, task: Task | None, reports: dict[int, tuple[str, Any]]) -> Any:
    """Make this process's Trainer and task look as rank 0's did at the end of the stage."""
    results = reports[0][1]
    task = task if task is not None else t.task
    if task is not None and results["weights"] is not None:
        task.load_state_dict(results["weights"])
        t.task, task._trainer = task, t
    t.state = results["state"]
    t.metric_store.callback_metrics.clear()
    t.metric_store.callback_metrics.update(results["callback_metrics"])
    t.logged_metrics.clear()
    t.logged_metrics.update(results["logged_metrics"])
    for cb in t.callbacks:
        if cb.state_key in results["callbacks"]:
            dirpath, state = results["callbacks"][cb.state_key]
            if dirpath is not None and hasattr(cb, "dirpath"):
                cb.dirpath = dirpath
            if state:  # (as Lightning loads callback states: an empty or None state has nothing to restore)
                cb.load_state_dict(state)
    for lg, version in zip(t.loggers, results["versions"]):
        lg._version = version
    return results["value"]
