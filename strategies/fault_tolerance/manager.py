"""torchft's Manager for one replica group, built the way Tandem needs it: the lighthouse checked first (a
clear error when none answers), its server and store listening on this group's address only, the state sent
as plain data (transport.py), and each call's failure turned into a FaultToleranceError with the reason."""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist

from strategies.fault_tolerance.options import EXTRA, Resolved
from strategies.fault_tolerance.transport import SafeTransport
from tandem_core.errors import FaultToleranceError, require

_LIGHTHOUSE_RETRIES = 100


def require_torchft(verbose: bool = False) -> None:
    """MissingExtraError naming the extra when torchft is not installed. Unless `verbose` (or RUST_LOG is
    set), torchft's own logs (its Rust part logs every quorum and commit at INFO) show warnings only."""
    require("torchft", "in-place fault tolerance (FaultTolerance)", EXTRA)
    if not verbose:
        os.environ.setdefault("RUST_LOG", "warn")  # read once, when torchft's extension is first imported
        logging.getLogger("torchft.manager").addFilter(_quiet)


def _quiet(record: logging.LogRecord) -> bool:
    """Drop torchft's warning that NCCL's flight recorder cannot be reset (said at every quorum off NCCL)."""
    return "flight recorder" not in record.getMessage()


def wait_for_lighthouse(r: Resolved) -> float:
    """Seconds until the lighthouse accepted a connection; a FaultToleranceError after connect_timeout_s."""
    start, last = time.monotonic(), None
    deadline = start + r.options.connect_timeout_s
    while True:
        try:
            with socket.create_connection((r.lighthouse_host, r.lighthouse_port), timeout=2.0):
                return time.monotonic() - start
        except OSError as e:
            last = e
        if time.monotonic() >= deadline:
            raise FaultToleranceError(
                f"replica group {r.replica_group}: no lighthouse reachable at {r.lighthouse} within "
                f"connect_timeout_s={r.options.connect_timeout_s:g}s ({type(last).__name__}: {last}). Start it "
                f"first, on one node: `tandem lighthouse --bind {r.lighthouse_host}:{r.lighthouse_port} "
                f"--min-replicas {r.options.min_replicas}`, and check the address and that this machine can "
                "reach it (docs/fault-tolerance.md)."
            )
        time.sleep(0.2)


@contextlib.contextmanager
def _bound_to(address: str) -> Iterator[None]:
    """torchft's Manager starts its server on every interface ([::]); make it listen on `address` only."""
    import torchft.manager as module

    original = module.ManagerServer

    def bound(**kwargs: Any) -> Any:
        port = str(kwargs["bind"]).rsplit(":", 1)[1]
        kwargs["bind"] = f"[{address}]:{port}" if ":" in address else f"{address}:{port}"
        return original(**kwargs)

    module.ManagerServer = bound
    try:
        yield
    finally:
        module.ManagerServer = original


class ReplicaManager:
    """One replica group's torchft Manager: `quorum()` before a step, `allreduce()` during it, `commit()`
    before the optimizer step. `state` and `load` are the state a live group sends a rejoining one and how
    that group takes it (called by torchft, `state` on its quorum thread)."""

    def __init__(
        self,
        r: Resolved,
        rank: int,
        world: int,
        device: torch.device,
        broadcast: Callable[[Any], Any],
        state: Callable[[], Any],
        load: Callable[[Any], None],
    ) -> None:
        require_torchft()
        from torchft import Manager, ProcessGroupGloo, ProcessGroupNCCL

        self.r = r
        opts = r.options
        self.lighthouse_s = wait_for_lighthouse(r)
        timeout = datetime.timedelta(seconds=opts.timeout_s)
        # a store of this start of the group only (torchrun's shared store keeps the keys of a killed start),
        # on rank 0; its server listens on every interface (torch's TCPStore has no bind address)
        self._store = (
            dist.TCPStore(r.address, 0, is_master=True, wait_for_workers=False) if rank == 0 else None
        )
        host, port = broadcast((r.address, self._store.port) if self._store is not None else None)
        # the process group across groups takes what the group's own takes: NCCL where the strategy's
        # communication device is a GPU, gloo (CPU tensors) elsewhere; what Tandem hands it is made there
        self.device = device
        self.pg = (
            ProcessGroupNCCL(timeout=timeout) if device.type == "cuda" else ProcessGroupGloo(timeout=timeout)
        )
        self.transport = SafeTransport(self.pg, timeout, device)
        with _bound_to(r.address):
            self.manager = Manager(
                pg=self.pg,
                load_state_dict=load,
                state_dict=state,
                min_replica_size=opts.min_replicas,
                use_async_quorum=False,  # the quorum (and a heal) completes before the step's forward
                timeout=timeout,
                quorum_timeout=datetime.timedelta(seconds=opts.quorum_timeout_s),
                connect_timeout=datetime.timedelta(seconds=opts.connect_timeout_s),
                rank=rank,
                world_size=world,
                store_addr=host,
                store_port=port,
                lighthouse_addr=r.lighthouse,
                replica_id=r.replica_id,
                hostname=r.address,
                checkpoint_transport=self.transport,
                init_sync=True,  # a first quorum at step 0 gives every group one group's weights
                # the lighthouse may restart: its server keeps asking it (quorum_timeout_s still bounds a step)
                quorum_retries=_LIGHTHOUSE_RETRIES,
            )

    def quorum(self) -> None:
        """Join the quorum for the next step (the lighthouse waits up to quorum_timeout_s for min_replicas
        groups); heals this group from a live peer first when it is behind."""
        opts = self.r.options
        try:
            self.manager.start_quorum(timeout=datetime.timedelta(seconds=opts.quorum_timeout_s))
        except FaultToleranceError:
            raise
        except Exception as e:
            raise FaultToleranceError(
                f"replica group {self.r.replica_group}: no quorum of min_replicas={opts.min_replicas} replica "
                f"group(s) within quorum_timeout_s={opts.quorum_timeout_s:g}s through the lighthouse at "
                f"{self.r.lighthouse} ({type(e).__name__}: {_first_line(e)}). The other groups are gone or cut "
                "off, or the lighthouse is down; this group stops rather than train apart from them. Its "
                "launcher's restart (torchrun --max-restarts) rejoins the job once it is reachable again."
            ) from e
        if self.transport.failure is not None:
            failure, self.transport.failure = self.transport.failure, None
            raise FaultToleranceError(
                f"replica group {self.r.replica_group}: the state a live peer sent could not be read as plain "
                f"data ({type(failure).__name__}: {_first_line(failure)}); every state a group holds (callbacks', "
                "the DataModule's) must be plain data, as in a checkpoint file."
            ) from failure

    @property
    def participants(self) -> int:
        """Replica groups in the current quorum."""
        return self.manager.num_participants()

    @property
    def errored(self) -> BaseException | None:
        return self.manager.errored()

    def allreduce_sum(self, tensor: torch.Tensor) -> Any:
        """Sum `tensor` over the live groups (asynchronously); a failure marks the step uncommitted."""
        from torch.distributed import ReduceOp

        return self.manager.allreduce(tensor, reduce_op=ReduceOp.SUM)

    def commit(self) -> bool:
        """Whether this group may step its optimizer: every rank of it finished the step's collectives."""
        try:
            return self.manager.should_commit()
        except Exception as e:
            raise FaultToleranceError(
                f"replica group {self.r.replica_group}: could not commit a step ({type(e).__name__}: "
                f"{_first_line(e)})"
            ) from e

    @property
    def step(self) -> int:
        """Steps committed by the job so far (torchft's count; a rejoining group takes the live one's)."""
        return self.manager.current_step()

    def state_dict(self) -> dict[str, int]:
        return self.manager.state_dict()

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.manager.load_state_dict(state)

    def shutdown(self) -> None:
        self.manager.shutdown(wait=False)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__
