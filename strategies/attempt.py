"""One key per start of the workers, agreed by every rank on every node, on a store that outlives restarts.

torchrun's agents (and Tandem's own launcher) hand the workers the rendezvous's TCP store by default
(TORCHELASTIC_USE_AGENT_STORE=True), and that store keeps every key of the previous start: the process
group's addresses of ranks that are dead now. A restarted rank that reads them connects to a dead peer
("Connection refused" in gloo's connectFullMesh). So the group is built under a prefix private to this
start. The node-local TORCHELASTIC_RESTART_COUNT cannot be that prefix: torchrun's agents count restarts
per node (the node whose worker failed counts one more than the others). Nor is the rendezvous round
visible to the workers (it lives in the agents' own store).

The key: global rank 0 draws a fresh random token each start and publishes it; every other rank reads it
and proves it current by a handshake only a live rank 0 can answer: it writes a random nonce of its own
under the token and waits until rank 0 echoes that nonce back. A token left by a previous start (its rank 0
is dead: the agents stop every worker before any worker of the next start runs) is never answered, and the
rank reads the published token again until it changes. Cost: a few store round trips per start.
"""

from __future__ import annotations

import datetime
import time
import uuid

import torch.distributed as dist

from tandem_core.errors import DistributedError

KEY = "tandem/attempt"
POLL_S = 0.05


def agree(store: dist.Store, rank: int, world_size: int, timeout: datetime.timedelta) -> str:
    """The token of this start of the workers, the same on every rank (a DistributedError after `timeout`)."""
    deadline = time.monotonic() + timeout.total_seconds()
    if rank == 0:
        return _lead(store, world_size, deadline, timeout)
    return _follow(store, rank, deadline, timeout)


def _lead(store: dist.Store, world_size: int, deadline: float, timeout: datetime.timedelta) -> str:
    token = uuid.uuid4().hex
    store.set(KEY, token)
    hellos = {r: f"{KEY}/{token}/hello/{r}" for r in range(1, world_size)}
    if hellos:
        try:  # (keys under a fresh token can only come from ranks of this start)
            store.wait(
                list(hellos.values()), datetime.timedelta(seconds=max(0.0, deadline - time.monotonic()))
            )
        except RuntimeError:
            missing = [r for r, k in hellos.items() if not store.check([k])]
            _wait(0.0, timeout, f"rank(s) {missing} to join this start of the workers")
        for r, hello in hellos.items():
            store.set(f"{KEY}/{token}/ack/{r}", store.get(hello))  # echo its nonce: this token is live
    return token


def _follow(store: dist.Store, rank: int, deadline: float, timeout: datetime.timedelta) -> str:
    nonce = uuid.uuid4().hex.encode()
    while True:
        while not store.check([KEY]):
            _wait(deadline, timeout, "rank 0 to publish this start's key")
        token = store.get(KEY).decode()
        store.set(f"{KEY}/{token}/hello/{rank}", nonce)
        ack = f"{KEY}/{token}/ack/{rank}"
        while store.get(KEY).decode() == token:
            if store.check([ack]) and store.get(ack) == nonce:
                return token
            _wait(deadline, timeout, "rank 0 to answer (a key left by a previous start is never answered)")
        # a newer token: the one read was a previous start's; greet the live rank 0 under the new one


def _wait(deadline: float, timeout: datetime.timedelta, what: str) -> None:
    if time.monotonic() > deadline:
        raise DistributedError(
            f"waited timeout_s={timeout.total_seconds():g}s for {what} on the launcher's store; another rank "
            "has probably failed to start: look at its output."
        )
    time.sleep(POLL_S)
