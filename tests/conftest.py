"""Shared fixtures. `dist_run` runs a module-level function on N gloo processes on 127.0.0.1."""

from __future__ import annotations

import io
import os
import socket
import sys
import traceback
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# Trainer keywords for a quiet run: no logger, progress bar, checkpoints or model summary.
QUIET = dict(logger=False, enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False)
# ... and fast on the CPU: no sanity validation steps either.
FAST = dict(QUIET, accelerator="cpu", num_sanity_val_steps=0)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def loop_state(trainer: Any) -> Any:
    """Where the loop position (batch_in_epoch, ...) lives: trainer.state after the move, else trainer."""
    return getattr(trainer, "state", trainer)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world_size: int, port: int, fn: Callable, args: tuple, queue: Any) -> None:
    import torch.distributed as dist

    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
    )
    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
        result = fn(rank, world_size, *args)
        buf = io.BytesIO()
        torch.save(result, buf)  # bytes, not shared-memory tensors: the child exits right after
        queue.put((rank, "ok", buf.getvalue()))
    except BaseException:  # report every failure to the parent, then let the rank die
        queue.put((rank, "error", traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_distributed(fn: Callable, *args: Any, world_size: int = 2, timeout: float = 120.0) -> list[Any]:
    """Run fn(rank, world_size, *args) on `world_size` processes; return the results by rank.

    A rank that raises fails the test with that rank's traceback; nothing waits past `timeout`.
    """
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=_worker, args=(r, world_size, port, fn, args, queue), daemon=True)
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    try:
        for _ in range(world_size):
            rank, status, payload = queue.get(timeout=timeout)
            if status == "error":
                raise AssertionError(f"rank {rank} failed:\n{payload}")
            results[rank] = torch.load(io.BytesIO(payload), weights_only=False)
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
    return [results[r] for r in range(world_size)]


@pytest.fixture(autouse=True)
def _no_process_group_left():
    """Each test starts outside any process group. A one-process fit keeps its group open until exit (as a
    script's would: strategies/group_exit.py); left to the next test, it would change what that test sees
    (Lightning and Tandem both evaluate under no_grad, not inference_mode, inside a gloo group)."""
    yield
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


# the variables a launcher (or a strategy joining a group of one, such as Lightning's DDPStrategy at one device)
# writes into this process's environment: left to the next test, they make it look launched by torchrun
_LAUNCH_VARIABLES = (
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK", "MASTER_ADDR",
    "MASTER_PORT", "TORCHELASTIC_RUN_ID",
)  # fmt: skip


@pytest.fixture(autouse=True)
def _launch_variables_restored():
    """Each test ends with the launch variables it started with (Lightning's strategies, run in-process as the
    parity tests' oracle, export them and never take them back)."""
    before = {k: os.environ.get(k) for k in _LAUNCH_VARIABLES}
    ranks = _rank_zero_ranks()
    yield
    for k, v in before.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    for holder, attr, value in ranks:  # and the ranks rank_zero_warn reads (a strategy sets them)
        setattr(holder, attr, value)


def _rank_zero_ranks() -> list[tuple[Any, str, Any]]:
    """(object, attribute, value) of the process-wide ranks behind Tandem's and Lightning's rank_zero_* helpers."""
    found = []
    tandem = sys.modules.get("tandem_core.rank_zero")
    if tandem is not None:
        found.append((tandem.rank_zero_only, "_rank", tandem.rank_zero_only._rank))
    for name in ("lightning_utilities.core.rank_zero", "lightning_fabric.utilities.rank_zero"):
        module = sys.modules.get(name)
        holder = getattr(module, "rank_zero_only", None)
        if holder is not None and hasattr(holder, "rank"):
            found.append((holder, "rank", holder.rank))
    return found


@pytest.fixture(autouse=True)
def _torch_global_flags():
    """Trainer(deterministic=..., benchmark=...) sets torch-wide flags, as Lightning does: give every test
    the flags it started with."""
    det, warn = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    bench = torch.backends.cudnn.benchmark
    yield
    torch.use_deterministic_algorithms(det, warn_only=warn)
    torch.backends.cudnn.benchmark = bench


@pytest.fixture
def dist_run() -> Callable[..., list[Any]]:
    """Fixture form of run_distributed: dist_run(fn, *args, world_size=2)."""
    return run_distributed
