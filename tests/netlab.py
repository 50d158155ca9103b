"""The network lab for tests: a fixture body that builds benchmarks/lab.py's two nodes (or skips), and a
runner that starts one torchrun agent per node and waits for both with a deadline."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks.lab import Lab, LabError, guarded, unavailable  # noqa: E402

LAB_LOCK = "/tmp/tandem-lab.lock"  # the lab is shared by every test run on this machine (GUIDE.md)
RDZV_PORT = 29500  # inside node0's namespace: no other run can hold it
# What a two-node run on this machine needs (issue 14): the host name resolves to 127.0.0.1, so torch
# cannot tell node0 is the rendezvous host (is_host), gives 127.0.0.1 as each node's address (local_addr,
# which becomes the workers' MASTER_ADDR) and gloo binds 127.0.0.1 (GLOO_SOCKET_IFNAME).
ALL_SETTINGS = ("is_host", "local_addr", "gloo_ifname")
_RANK_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def lab_fixture(rate: str | None = None) -> Iterator[Lab]:
    """Body of a pytest fixture: yield a fresh lab, skip if this machine cannot host one, always remove it.
    The lab lock is held from before it is built until it is removed."""
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    with lab_lock():
        try:
            lab = Lab.up(rate)
        except LabError as e:
            pytest.skip(f"cannot build the network lab on this machine: {e}")
        with guarded(lab):
            yield lab


@contextlib.contextmanager
def lab_lock(timeout: float = 1800) -> Iterator[None]:
    """Hold /tmp/tandem-lab.lock (what `flock /tmp/tandem-lab.lock CMD` takes), unless this process or an
    ancestor already holds it (a test run started under flock, or a fixture that holds it around another):
    then waiting would be waiting on ourselves."""
    fd = os.open(LAB_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if _held_by_us(LAB_LOCK):
                    break
                if time.monotonic() > deadline:
                    raise LabError(
                        f"{LAB_LOCK} stayed locked for {timeout:.0f} s by another lab user"
                    ) from None
                time.sleep(1.0)
        yield
    finally:
        os.close(fd)  # releases the lock if we took it


def _held_by_us(path: str) -> bool:
    inode = os.stat(path).st_ino
    try:
        locks = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return False
    holders = {
        int(f[4]) for f in (line.split() for line in locks) if len(f) > 5 and f[5].endswith(f":{inode}")
    }
    pid = os.getpid()
    while pid > 1:
        if pid in holders:
            return True
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
    return False


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without a surrounding job's rank variables, unbuffered, with this checkout importable."""
    env = {k: v for k, v in os.environ.items() if k not in _RANK_VARS and not k.startswith("TORCHELASTIC_")}
    env.update(PYTHONUNBUFFERED="1", PYTHONPATH=ROOT, OMP_NUM_THREADS="1", **extra)
    return env


def torchrun_argv(
    lab: Lab,
    node: int,
    script_argv: list[str],
    settings: tuple[str, ...] = ALL_SETTINGS,
    max_restarts: int = 0,
    run_id: str = "lab",
    rdzv_conf: tuple[str, ...] = (),
) -> tuple[list[str], dict[str, str]]:
    """The command and environment of node `node`'s torchrun agent (one worker per node)."""
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=2",
        "--nproc_per_node=1",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={lab.addr(0)}:{RDZV_PORT}",
        f"--rdzv-id={run_id}",
        f"--max-restarts={max_restarts}",
        "--monitor-interval=0.1",
    ]
    env = clean_env()
    conf = [*rdzv_conf, *(["is_host=1"] if "is_host" in settings and node == 0 else [])]
    if conf:
        argv.append(f"--rdzv-conf={','.join(conf)}")
    if "local_addr" in settings:
        argv.append(f"--local-addr={lab.addr(node)}")
    if "gloo_ifname" in settings:
        env["GLOO_SOCKET_IFNAME"] = lab.iface(node)
    return [*argv, *script_argv], env


@dataclass
class NodeResult:
    """How one node's agent ended: exit code (None if killed at the deadline), seconds, merged output."""

    node: int
    returncode: int | None
    seconds: float
    output: str

    @property
    def timed_out(self) -> bool:
        return self.returncode is None

    def head(self, pattern: str = "rror", n: int = 3) -> list[str]:
        """The first `n` output lines containing `pattern` (what a user sees first)."""
        return [line for line in self.output.splitlines() if pattern in line][:n]


class TwoNodeJob:
    """One torchrun agent per node, output to files in `logdir`; `wait` bounds the whole job."""

    def __init__(
        self,
        lab: Lab,
        logdir: Path,
        script_argv: list[str],
        settings: tuple[str, ...] = ALL_SETTINGS,
        max_restarts: int = 0,
        env: dict[str, str] | None = None,
        rdzv_conf: tuple[str, ...] = (),
    ) -> None:
        self.lab, self.logs = lab, [logdir / "node0.log", logdir / "node1.log"]
        run_id = uuid.uuid4().hex[:8]
        self.start = time.monotonic()
        self.procs: list[subprocess.Popen[str]] = []
        for node in (0, 1):
            argv, node_env = torchrun_argv(lab, node, script_argv, settings, max_restarts, run_id, rdzv_conf)
            node_env.update(env or {})
            with open(self.logs[node], "w") as log:
                self.procs.append(lab.popen(node, argv, stdout=log, stderr=subprocess.STDOUT, env=node_env))
        self.ended: dict[int, float] = {}

    def output(self, node: int) -> str:
        return self.logs[node].read_text(errors="replace")

    def wait_for_output(self, node: int, text: str, timeout: float) -> float | None:
        """Seconds since the start when `text` first appeared in `node`'s output; None after `timeout`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.output(node):
                return time.monotonic() - self.start
            if all(p.poll() is not None for p in self.procs):
                return None
            time.sleep(0.05)
        return None

    def wait(self, timeout: float) -> list[NodeResult]:
        """Wait for both agents (up to `timeout` s from the start); kill what is still running then."""
        deadline = self.start + timeout
        while len(self.ended) < 2 and time.monotonic() < deadline:
            for node, proc in enumerate(self.procs):
                if node not in self.ended and proc.poll() is not None:
                    self.ended[node] = time.monotonic() - self.start
            time.sleep(0.05)
        results = []
        for node, proc in enumerate(self.procs):
            if node not in self.ended:
                self.kill(node)
            code = proc.returncode if node in self.ended else None
            seconds = self.ended.get(node, time.monotonic() - self.start)
            results.append(NodeResult(node, code, seconds, self.output(node)))
        return results

    def kill(self, node: int) -> None:
        """SIGKILL node `node`'s agent and its workers (their own session)."""
        proc = self.procs[node]
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, 9)
            except ProcessLookupError:
                pass
            proc.wait(timeout=10)


def kill_machine(lab: Lab, node: int) -> None:
    """SIGKILL every process in `node`'s namespace, the agent and its workers (their own session): a lost machine."""
    pids = subprocess.run(["ip", "netns", "pids", lab.ns(node)], capture_output=True, text=True, timeout=10)
    for pid in pids.stdout.split():
        try:
            os.kill(int(pid), 9)
        except ProcessLookupError:
            pass


def run_one_node(script_argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """The reference: the same script as 2 processes of one torchrun on loopback (not in the lab)."""
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *script_argv]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=clean_env())


def link_bytes(lab: Lab, node: int) -> tuple[int, int]:
    """(rx, tx) byte counters of `node`'s end of the link."""
    out = subprocess.run(
        ["ip", "-n", lab.ns(node), "-j", "-s", "link", "show", "dev", lab.iface(node)],
        capture_output=True,
        text=True,
        timeout=10,
        check=True,
    )
    stats = json.loads(out.stdout)[0]["stats64"]
    return int(stats["rx"]["bytes"]), int(stats["tx"]["bytes"])
