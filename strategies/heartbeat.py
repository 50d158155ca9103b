"""Liveness of the other ranks of a multi-node job: a heartbeat thread per rank over the c10d store.

A collective's timeout (timeout_s, 1800 s by default) cannot tell a lost node from a slow all-reduce. Each
rank instead bumps its own counter in the store every `interval_s` and watches everyone's; a rank whose
counter stops moving for `silence_s` (or a store that stops answering, for that long) ends this process with
a message naming the silent ranks and their hosts, since the main thread may be blocked in a collective
that would otherwise wait for timeout_s.
"""

from __future__ import annotations

import datetime
import os
import sys
import threading
import time

import torch.distributed as dist

from strategies.multinode import node_identity

PREFIX = "tandem/heartbeat"


class Heartbeat:
    """Start with `start()`; `stop()` before the process group closes (a normal exit stops nothing else).

    Two threads: one talks to the store (a store call to an unreachable node can block far longer than its
    timeout), the other only reads the times of the last news and ends the process when they grow too old.
    """

    def __init__(
        self, rank: int, world_size: int, silence_s: float, interval_s: float = 2.0, prefix: str | None = None
    ) -> None:
        self.rank, self.world_size = rank, world_size
        self.prefix = prefix or PREFIX  # this start's own keys on a store that outlives restarts
        self.silence_s, self.interval_s = silence_s, interval_s
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._beat, name="tandem-heartbeat", daemon=True),
            threading.Thread(target=self._watch, name="tandem-heartbeat-watch", daemon=True),
        ]
        self._peers = [r for r in range(world_size) if r != rank]
        self._hosts: dict[int, str] = {}
        self._seen: dict[int, tuple[bytes, float]] = {}  # rank -> (last counter value, when it last changed)
        self._store_ok = self._started = time.monotonic()  # the last store round trip that completed
        self._store_error: Exception | None = None
        self._me = node_identity()  # now: a node cut off the network later has no route to look up

    def _connect(self) -> dist.Store:
        """A store client of its own (the main thread's may be busy), with a short timeout."""
        return dist.TCPStore(
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
            is_master=False,
            timeout=datetime.timedelta(seconds=max(1.0, self.interval_s * 2)),
        )

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        """Stop beating and mark this rank as finished, so that its silence from now on is no failure."""
        self._stop.set()
        if self._threads[0].is_alive():
            self._threads[0].join(timeout=self.interval_s * 3)

    def _beat(self) -> None:
        store: dist.Store | None = None
        announced = False
        while not self._stop.wait(0 if store is None else self.interval_s):
            try:
                if store is None:
                    store = self._connect()
                if not announced:
                    store.set(f"{self.prefix}/host/{self.rank}", self._me)
                    announced = True
                if len(self._hosts) < len(self._peers):  # every rank announces itself right after joining
                    keys = [f"{self.prefix}/host/{r}" for r in self._peers]
                    store.wait(keys)
                    self._hosts = {r: store.get(k).decode() for r, k in zip(self._peers, keys)}
                store.add(f"{self.prefix}/{self.rank}", 1)
                self._read_peers(store)
                self._store_ok, self._store_error = time.monotonic(), None
            except Exception as e:  # noqa: BLE001 (any store failure counts as silence: _watch reports it)
                store, self._store_error = None, e
                self._stop.wait(self.interval_s)
        if store is not None:
            try:
                store.set(f"{self.prefix}/done/{self.rank}", "1")
            except Exception:  # noqa: BLE001 (best effort: the peers may be gone already)
                pass

    def _read_peers(self, store: dist.Store) -> None:
        now = time.monotonic()
        for r in self._peers:
            if self._seen.get(r, (b"", 0.0))[0] == b"done":
                continue
            if store.check([f"{self.prefix}/done/{r}"]):
                self._seen[r] = (b"done", float("inf"))
                continue
            key = f"{self.prefix}/{r}"
            if store.check([key]):
                value = store.get(key)
                if r not in self._seen or self._seen[r][0] != value:
                    self._seen[r] = (value, now)

    def _watch(self) -> None:
        while not self._stop.wait(self.interval_s / 2):
            now = time.monotonic()
            silent = [
                r for r in self._peers if now - self._seen.get(r, (b"", self._started))[1] > self.silence_s
            ]
            if silent and not self._stop.is_set():
                self._fail(silent, now - self._store_ok > self.silence_s)

    def _fail(self, silent: list[int], store_stalled: bool) -> None:
        where = f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
        unknown = f"an unknown host (the store's host is {where})"
        names = ", ".join(f"rank {r} on {self._hosts.get(r, unknown)}" for r in silent)
        error = f" ({self._store_error})" if self._store_error else ""
        detail = f"; the store at {where} did not answer either{error}" if store_stalled else ""
        print(
            f"tandem: DistributedError: rank {self.rank}/{self.world_size} on {self._me}: no heartbeat "
            f"from {names} for {self.silence_s:g}s{detail}. That node or process was lost (killed, crashed or "
            "cut off the network); ending this rank now instead of waiting for the collective timeout "
            "(timeout_s). Raise DDPStrategy(peer_timeout_s=...) if ranks can legitimately stall this long.",
            file=sys.stderr,
            flush=True,
        )
        os._exit(1)
