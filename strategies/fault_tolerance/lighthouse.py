"""`tandem lighthouse`: torchft's lighthouse, the process every replica group asks for each step's quorum,
started on one node (or beside the job) and listening on the one address given.

    tandem lighthouse --bind 10.0.0.1:29510 --min-replicas 1
    tandem lighthouse --bind 127.0.0.1:0 --min-replicas 2 --address-file /tmp/lighthouse.url

It runs torchft's own server (the one its `torchft_lighthouse` command starts, which listens on every
interface by default) until SIGTERM or SIGINT. The jobs reach it with FaultTolerance(lighthouse=URL) or the
TORCHFT_LIGHTHOUSE variable.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Sequence

from tandem_core.errors import TandemError
from tandem_core.fileio import atomic_write

_ANY = ("", "0.0.0.0", "::", "[::]", "*")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tandem lighthouse",
        description="Run torchft's lighthouse for fault-tolerant replica groups (docs/fault-tolerance.md).",
    )
    p.add_argument(
        "--bind",
        required=True,
        metavar="HOST:PORT",
        help="the one address to listen on (this node's address on the network the replica groups share; "
        "port 0 picks a free one)",
    )
    p.add_argument("--min-replicas", type=int, required=True, help="replica groups a quorum needs")
    p.add_argument("--join-timeout-ms", type=int, default=60000,
                   help="how long a quorum waits for a group that heartbeats but has not asked yet")  # fmt: skip
    p.add_argument("--quorum-tick-ms", type=int, default=100, help="how often a waiting quorum is checked")
    p.add_argument("--heartbeat-timeout-ms", type=int, default=5000,
                   help="a group silent this long is dropped from the next quorum")  # fmt: skip
    p.add_argument("--address-file", metavar="FILE", help="write the lighthouse's URL here once it listens")
    p.add_argument("--verbose", action="store_true", help="torchft's own logs of every quorum (INFO)")
    p.add_argument(
        "--any-address",
        action="store_true",
        help="allow --bind 0.0.0.0 / [::] (every interface: anyone who reaches the machine can join quorums)",
    )
    return p


def split_bind(bind: str) -> tuple[str, int]:
    """('10.0.0.1', 29510) from '10.0.0.1:29510' ('[::1]:0' for IPv6)."""
    host, sep, port = bind.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise TandemError(f"--bind {bind!r}: give HOST:PORT, e.g. 10.0.0.1:29510 (port 0: a free one)")
    return host.strip("[]") if host not in ("[::]",) else host, int(port)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `tandem lighthouse`; returns the exit status."""
    args = _parser().parse_args(argv)
    try:
        host, port = split_bind(args.bind)
        if host in _ANY and not args.any_address:
            raise TandemError(
                f"--bind {args.bind} listens on every interface: anyone who reaches this machine could join "
                "the quorums. Give this node's address on the network the replica groups share, or add "
                "--any-address to mean it."
            )
        if args.min_replicas < 1:
            raise TandemError("--min-replicas must be at least 1")
        from strategies.fault_tolerance.manager import require_torchft

        require_torchft(verbose=args.verbose)
        from torchft._torchft import LighthouseServer

        shown = f"[{host}]" if ":" in host else host
        server = LighthouseServer(
            bind=f"{shown}:{port}",
            min_replicas=args.min_replicas,
            join_timeout_ms=args.join_timeout_ms,
            quorum_tick_ms=args.quorum_tick_ms,
            heartbeat_timeout_ms=args.heartbeat_timeout_ms,
        )
    except TandemError as e:
        print(f"tandem lighthouse: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # the server could not listen there (address not on this machine, port taken)
        print(f"tandem lighthouse: error: cannot listen on {args.bind}: {e}", file=sys.stderr)
        return 1
    url = f"http://{shown}:{int(server.address().rsplit(':', 1)[1])}"
    print(
        f"tandem lighthouse: listening on {url} (min_replicas={args.min_replicas}, heartbeat timeout "
        f"{args.heartbeat_timeout_ms} ms, join timeout {args.join_timeout_ms} ms); replica groups reach it with "
        f"FaultTolerance(lighthouse={url!r}) or TORCHFT_LIGHTHOUSE={url}",
        flush=True,
    )
    if args.address_file:
        atomic_write(args.address_file, url + "\n")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(1.0):
        pass
    server.shutdown()
    if args.address_file and os.path.exists(args.address_file):
        os.remove(args.address_file)
    print("tandem lighthouse: stopped", flush=True)
    return 0
