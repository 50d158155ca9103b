"""How a live replica group's state reaches a rejoining one: over the process group torchft's manager
reconfigures at every quorum, as one ``torch.save`` buffer read back with ``torch.load(weights_only=True)``.

torchft's own transports unpickle what the peer sends (PGTransport its metadata, HTTPTransport the whole
state), so any process that joins the quorum as the recovery source could run code in the rejoining one. A
Tandem checkpoint is plain data by design (trainer/checkpoint/format.py), so it travels in that form and is
read with the safe unpickler, as a checkpoint file is. Sharded (DTensor) values travel as their local shards:
rank r of a group receives from rank r of its peer, which holds the same shard (strategies/fault_tolerance/
shards.py puts them back)."""

from __future__ import annotations

import io
import pickle
from datetime import timedelta
from typing import Any

import torch

from strategies.comm_device import to_comm
from strategies.fault_tolerance.shards import to_local


class SafeTransport:
    """torchft's checkpoint transport for Tandem (the methods of its CheckpointTransport): send the state as
    bytes, load it as plain data only.

    A failure to read what arrived (a value that is not plain data, a torn transfer) is kept in `failure` for
    the strategy to raise with the reason: torchft itself would only log it and retry the heal at every step.
    """

    def __init__(self, pg: Any, timeout: timedelta, device: torch.device) -> None:
        self._pg, self._timeout, self._device = pg, timeout, device
        self.failure: BaseException | None = None
        self.sent = self.received = 0  # bytes, for the logs

    def metadata(self) -> str:
        return "tandem-safe"

    def disallow_checkpoint(self) -> None:
        pass  # the send is complete when send_checkpoint returns

    def send_checkpoint(self, dst_ranks: list[int], step: int, state_dict: Any, timeout: timedelta) -> None:
        buf = io.BytesIO()
        torch.save({"step": step, "state": to_local(state_dict)}, buf)
        data = to_comm(torch.frombuffer(bytearray(buf.getbuffer()), dtype=torch.uint8), self._device)
        size = to_comm([data.numel()], self._device, torch.int64)
        works = []
        for dst in dst_ranks:
            works += [self._pg.send([size], dst, tag=1), self._pg.send([data], dst, tag=2)]
        for work in works:
            work.wait(timeout)
        self.sent += data.numel() * len(dst_ranks)

    def recv_checkpoint(self, src_rank: int, metadata: str, step: int, timeout: timedelta) -> Any:
        try:
            size = to_comm([0], self._device, torch.int64)
            self._pg.recv([size], src_rank, tag=1).wait(timeout)
            # (a host read, once per rejoin: the buffer's size)
            data = to_comm(torch.empty(int(size.item()), dtype=torch.uint8), self._device)
            self._pg.recv([data], src_rank, tag=2).wait(timeout)
            self.received += data.numel()
            got = torch.load(io.BytesIO(data.cpu().numpy().tobytes()), weights_only=True)
        except pickle.UnpicklingError as e:
            self.failure = e
            raise
        if got.get("step") != step:
            self.failure = RuntimeError(f"the peer sent the state of step {got.get('step')}, not {step}")
            raise self.failure
        return got["state"]

    def shutdown(self, wait: bool = True) -> None:
        pass
