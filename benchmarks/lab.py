"""A two-node network lab on one machine: namespaces "node0" and "node1" joined by one veth pair.

Each namespace has loopback and one end of the pair (lab0 / lab1) with an address in 10.213.7.0/30,
and nothing else: no default route, no NAT, no bridge, so traffic can only go between the two nodes.
An optional `tc tbf` rate limit sits on both ends. Needs root and iproute2.

    python benchmarks/lab.py up --rate 1gbit      # state in /tmp/tandem-lab.json
    python benchmarks/lab.py exec node1 -- python -c 'print(1)'
    python benchmarks/lab.py cut node1 / restore node1 / rate 100mbit / throughput / status
    python benchmarks/lab.py down
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

# every namespace is named PREFIX-<tag>-node<k>; a user of the machine names its own (TANDEM_LAB_PREFIX=ft-lab)
PREFIX = os.environ.get("TANDEM_LAB_PREFIX", "tandem-lab")
ADDRS = ("10.213.7.1", "10.213.7.2")  # a /30 of our own: .1 is node0, .2 is node1
PREFIX_LEN = 30
IFACES = ("lab0", "lab1")  # the veth end inside node0 / node1
STATE = os.environ.get("TANDEM_LAB_STATE", "/tmp/tandem-lab.json")
_RATE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit)$")
_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}


class LabError(RuntimeError):
    """The lab could not be built or changed; the message says what to do."""


def _cmd(argv: list[str], check: bool = True, timeout: float = 15) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and out.returncode != 0:
        raise LabError(f"`{' '.join(argv)}` failed ({out.returncode}): {out.stderr.strip()}")
    return out


def unavailable() -> str | None:
    """Why this machine cannot host the lab (not root, no iproute2), or None if it can."""
    if os.name != "posix" or os.geteuid() != 0:
        return "the network lab needs root (it creates network namespaces)"
    missing = [t for t in ("ip", "tc") if shutil.which(t) is None]
    if missing:
        return f"the network lab needs iproute2 ({', '.join(missing)} not found on PATH)"
    return None


def rate_bytes_per_s(rate: str) -> float:
    """'100mbit' -> 12.5e6: the tc rates the lab accepts are <number>{bit,kbit,mbit,gbit}."""
    m = _RATE.match(rate.strip().lower())
    if not m:
        raise LabError(f"rate {rate!r} is not of the form <number>{{bit,kbit,mbit,gbit}}, e.g. 100mbit")
    return float(m.group(1)) * _UNITS[m.group(2)] / 8


def namespaces() -> list[str]:
    """Every lab namespace on this machine (ours and other runs')."""
    out = _cmd(["ip", "netns", "list"], check=False)
    names = [line.split()[0] for line in out.stdout.splitlines() if line.strip()]
    return [n for n in names if n.startswith(PREFIX + "-")]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_namespace(ns: str) -> None:
    """SIGKILL what still runs in `ns` (only the lab's own commands can be there), then delete it."""
    pids = _cmd(["ip", "netns", "pids", ns], check=False).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    _cmd(["ip", "netns", "del", ns], check=False)


def sweep_stale() -> list[str]:
    """Delete the namespaces of test labs whose owning process is gone (a run killed by SIGKILL)."""
    removed = []
    for ns in namespaces():
        m = re.match(rf"^{PREFIX}-p(\d+)-", ns)
        if m and not _pid_alive(int(m.group(1))):
            _kill_namespace(ns)
            removed.append(ns)
    return removed


@dataclass
class Lab:
    """Two namespaces joined by a veth pair; `Lab.up()` builds it, `down()` removes every trace."""

    tag: str
    rate: str | None = None
    procs: list[subprocess.Popen[Any]] = field(default_factory=list, repr=False)

    @property
    def nodes(self) -> tuple[str, str]:
        return (f"{PREFIX}-{self.tag}-node0", f"{PREFIX}-{self.tag}-node1")

    def ns(self, node: int) -> str:
        return self.nodes[node]

    def addr(self, node: int) -> str:
        return ADDRS[node]

    def iface(self, node: int) -> str:
        return IFACES[node]

    @classmethod
    def up(cls, rate: str | None = None, tag: str | None = None) -> Lab:
        """Build the lab; a failure half-way removes what was made. `tag` defaults to this process."""
        reason = unavailable()
        if reason:
            raise LabError(reason)
        if rate is not None:
            rate_bytes_per_s(rate)
        sweep_stale()
        lab = cls(tag or f"p{os.getpid()}-{time.monotonic_ns() % 10**9}", rate)
        if any(ns in namespaces() for ns in lab.nodes):
            raise LabError(f"a lab tagged {lab.tag!r} is already up: `python benchmarks/lab.py down` first")
        try:
            for ns in lab.nodes:
                _cmd(["ip", "netns", "add", ns])
            a, b = lab.nodes
            # created directly inside the namespaces: nothing of the lab ever exists in the host's namespace
            _cmd(f"ip link add {IFACES[0]} netns {a} type veth peer name {IFACES[1]} netns {b}".split())
            for node, ns in enumerate(lab.nodes):
                _cmd(["ip", "-n", ns, "link", "set", "lo", "up"])
                _cmd(["ip", "-n", ns, "addr", "add", f"{ADDRS[node]}/{PREFIX_LEN}", "dev", IFACES[node]])
                _cmd(["ip", "-n", ns, "link", "set", IFACES[node], "up"])
            lab.set_rate(rate)
            lab._check_isolated()
        except BaseException:
            lab.down()
            raise
        return lab

    def _check_isolated(self) -> None:
        """Refuse to run with any route but the /30 link's: traffic must stay between the two nodes."""
        for ns in self.nodes:
            routes = _cmd(["ip", "-n", ns, "-4", "route", "show"]).stdout.strip().splitlines()
            extra = [r for r in routes if not r.startswith(f"10.213.7.0/{PREFIX_LEN} ")]
            if extra:
                raise LabError(f"namespace {ns} has unexpected routes {extra}; refusing to run")

    def set_rate(self, rate: str | None) -> None:
        """Put a token-bucket limit of `rate` on both ends of the link (None removes it)."""
        for node, ns in enumerate(self.nodes):
            base = ["tc", "-n", ns, "qdisc"]
            if rate is None:
                _cmd([*base, "del", "dev", IFACES[node], "root"], check=False)
                continue
            # a burst of 4 ms at the rate (tbf needs at least rate/HZ, HZ=250 here) and a 50 ms queue before
            # drops; tokens saved while the link idles let a burst pass at the veth's speed, and 10 ms let
            # a 1 MB transfer after a pause through at 2.5-3 Gbit/s on a "1 Gbit" link (4 ms: 1.0-1.3)
            burst = max(16 * 1024, int(rate_bytes_per_s(rate) / 250))
            _cmd(
                [
                    *base,
                    "replace",
                    "dev",
                    IFACES[node],
                    "root",
                    "tbf",
                    "rate",
                    rate,
                    "burst",
                    str(burst),
                    "latency",
                    "50ms",
                ]
            )
        self.rate = rate

    def cut(self, node: int) -> None:
        """Take `node`'s end of the link down: packets stop both ways, sockets are not told."""
        _cmd(["ip", "-n", self.ns(node), "link", "set", IFACES[node], "down"])

    def restore(self, node: int) -> None:
        """Bring `node`'s end back up (the kernel puts the /30 route back with it)."""
        _cmd(["ip", "-n", self.ns(node), "link", "set", IFACES[node], "up"])

    def command(self, node: int, argv: list[str]) -> list[str]:
        """`argv` run inside `node`'s namespace."""
        return ["ip", "netns", "exec", self.ns(node), *argv]

    def run(self, node: int, argv: list[str], timeout: float, **kw: Any) -> subprocess.CompletedProcess[str]:
        """Run `argv` in `node` to completion (bounded by `timeout`); text output captured."""
        kw.setdefault("capture_output", True)
        return subprocess.run(self.command(node, argv), text=True, timeout=timeout, **kw)

    def popen(self, node: int, argv: list[str], **kw: Any) -> subprocess.Popen[str]:
        """Start `argv` in `node` in its own session, so `down()` can end it and its children."""
        proc = subprocess.Popen(self.command(node, argv), text=True, start_new_session=True, **kw)
        self.procs.append(proc)
        return proc

    def down(self) -> None:
        """End the lab's processes and delete both namespaces (with them the veth pair); idempotent."""
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)  # its own session: the command and its children
                except ProcessLookupError:
                    pass
                proc.wait(timeout=10)
        for ns in self.nodes:
            if ns in namespaces():
                _kill_namespace(ns)

    def state(self) -> dict[str, Any]:
        return {"tag": self.tag, "rate": self.rate, "nodes": list(self.nodes), "addrs": list(ADDRS)}

    def __enter__(self) -> Lab:
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()


@contextlib.contextmanager
def guarded(lab: Lab) -> Iterator[Lab]:
    """Remove `lab` on leaving the block, at interpreter exit, and on SIGTERM/SIGHUP meanwhile."""
    atexit.register(lab.down)
    saved: dict[int, Any] = {}
    try:
        for sig in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(sig) is signal.SIG_DFL:
                saved[sig] = signal.signal(
                    sig, lambda s, _f: sys.exit(128 + s)
                )  # SystemExit unwinds to finally
    except ValueError:  # not the main thread: the finally below and atexit still apply
        pass
    try:
        yield lab
    finally:
        lab.down()
        for sig, old in saved.items():
            signal.signal(sig, old)
        atexit.unregister(lab.down)


# one TCP stream: the sink counts what arrives until EOF; the source times sending nbytes and the EOF's ack
_SINK = """
import socket, sys
server = socket.create_server((sys.argv[1], int(sys.argv[2])))
conn, _ = server.accept()
n = 0
while chunk := conn.recv(1 << 20):
    n += len(chunk)
print(n)
"""
_SOURCE = """
import socket, sys, time
for _ in range(200):
    try:
        conn = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
        break
    except OSError:
        time.sleep(0.05)
left, buf = int(sys.argv[3]), b"x" * (1 << 16)
start = time.perf_counter()
while left > 0:
    conn.sendall(buf[:left])
    left -= min(left, len(buf))
conn.shutdown(socket.SHUT_WR)
conn.recv(1)
print(time.perf_counter() - start)
"""


def throughput(lab: Lab, nbytes: int = 8 << 20, timeout: float = 60) -> float:
    """Bytes per second of one TCP stream node0 -> node1, `nbytes` long."""
    port = str(29400)
    srv = lab.popen(1, [sys.executable, "-c", _SINK, lab.addr(1), port], stdout=subprocess.PIPE)
    try:
        cli = lab.run(0, [sys.executable, "-c", _SOURCE, lab.addr(1), port, str(nbytes)], timeout=timeout)
        got, _ = srv.communicate(timeout=timeout)
    finally:
        if srv.poll() is None:
            os.killpg(srv.pid, signal.SIGKILL)
            srv.wait(timeout=10)
    if cli.returncode != 0 or int(got) != nbytes:
        raise LabError(f"throughput probe failed: {cli.stderr.strip()} (received {got.strip()} bytes)")
    return nbytes / float(cli.stdout)


def _load() -> Lab:
    if not os.path.exists(STATE):
        raise LabError(f"no lab is up ({STATE} not found): `python benchmarks/lab.py up` first")
    with open(STATE) as f:
        s = json.load(f)
    return Lab(s["tag"], s["rate"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="build the lab and write its state file")
    up.add_argument("--rate", default=None, help="tc tbf rate on both ends, e.g. 1gbit, 100mbit")
    sub.add_parser("down", help="remove the lab the state file names")
    sub.add_parser("status", help="print the lab's namespaces, addresses and qdiscs")
    sub.add_parser("throughput", help="measure node0 -> node1 TCP throughput")
    for name in ("cut", "restore"):
        sub.add_parser(name, help=f"{name} a node's end of the link").add_argument(
            "node", choices=["node0", "node1"]
        )
    sub.add_parser("rate", help="change the rate limit ('none' removes it)").add_argument("rate")
    ex = sub.add_parser("exec", help="run a command in a node: exec node1 -- CMD ...")
    ex.add_argument("node", choices=["node0", "node1"])
    ex.add_argument("argv", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    try:
        if args.cmd == "up":
            if os.path.exists(STATE) and _load().nodes[0] in namespaces():
                raise LabError(f"a lab is already up ({STATE}); `python benchmarks/lab.py down` first")
            lab = Lab.up(args.rate, tag=os.environ.get("TANDEM_LAB_TAG", "cli"))
            with open(STATE, "w") as f:
                json.dump(lab.state(), f)
            print(f"node0={lab.ns(0)} {ADDRS[0]} ({IFACES[0]})  node1={lab.ns(1)} {ADDRS[1]} ({IFACES[1]})")
            print(
                f"rate={args.rate or 'unlimited'}; state in {STATE}; remove with: python benchmarks/lab.py down"
            )
            return 0
        lab = _load()
        node = int(getattr(args, "node", "node0")[-1])
        if args.cmd == "down":
            lab.down()
            os.remove(STATE)
            print(f"removed {', '.join(lab.nodes)}")
        elif args.cmd == "status":
            for n, ns in enumerate(lab.nodes):
                print(f"{ns}: {ADDRS[n]}/{PREFIX_LEN} on {IFACES[n]}, up={ns in namespaces()}")
                print(_cmd(["tc", "-n", ns, "qdisc", "show", "dev", IFACES[n]], check=False).stdout.strip())
        elif args.cmd == "throughput":
            print(f"{throughput(lab) * 8 / 1e6:.1f} Mbit/s node0 -> node1")
        elif args.cmd in ("cut", "restore"):
            getattr(lab, args.cmd)(node)
        elif args.cmd == "rate":
            lab.set_rate(None if args.rate == "none" else args.rate)
            with open(STATE, "w") as f:
                json.dump(lab.state(), f)
        elif args.cmd == "exec":
            argv_ = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
            return subprocess.call(lab.command(node, argv_))
    except LabError as e:
        print(f"lab: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
