"""Jobs of tests/scripts/replica_train.py in the two-node network lab (benchmarks/lab.py), for the fault-tolerance
tests (tests/test_ft_lab.py) and benchmark (benchmarks/fault_tolerance.py):

- `mode="ft"`: the lighthouse on node0 and one replica group per node, each its own single-node torchrun (which
  restarts its killed worker);
- `mode="plain"`: plain DDP, one torchrun agent per node in one rendezvous (a killed worker restarts both);

and readers of the per-step lines the script prints.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from benchmarks.lab import Lab

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tests", "scripts", "replica_train.py")
RDZV_PORT = 29500  # plain mode's rendezvous, inside node0's namespace
_RANK_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without a surrounding job's rank variables, unbuffered, with this checkout importable."""
    env = {k: v for k, v in os.environ.items() if k not in _RANK_VARS and not k.startswith("TORCHELASTIC_")}
    env.update(PYTHONUNBUFFERED="1", PYTHONPATH=ROOT, OMP_NUM_THREADS="1", **extra)
    return env


@dataclass
class Step:
    """One STEP line of replica_train.py."""

    group: int
    gs: int
    epoch: int
    batch: int
    t: float
    pid: int
    ids: str
    w: str
    rng: str
    dt: float
    committed: bool
    participants: int

    @classmethod
    def parse(cls, line: str) -> Step:
        d = dict(kv.split("=", 1) for kv in line.split()[1:])
        return cls(
            int(d["g"]), int(d["gs"]), int(d["ep"]), int(d["b"]), float(d["t"]), int(d["pid"]), d["ids"],
            d["w"], d["rng"], float(d["dt"]), d["c"] == "1", int(d["p"]),
        )  # fmt: skip


class LabJob:
    """Two nodes running replica_train.py (see the module's docstring); `out` holds the logs and the weights."""

    def __init__(
        self,
        lab: Lab,
        out: Path,
        script_args: list[str],
        mode: str = "ft",
        min_replicas: int = 1,
        restarts: int = 0,
        heartbeat_ms: int = 5000,
    ) -> None:
        self.lab, self.out, self.min_replicas, self.heartbeat_ms = lab, out, min_replicas, heartbeat_ms
        out.mkdir(parents=True, exist_ok=True)
        self.stop_file = out / "stop"
        self.lighthouse: subprocess.Popen[str] | None = None
        self.url = self.start_lighthouse() if mode == "ft" else ""
        self.procs: list[subprocess.Popen[str]] = []
        self.start = time.monotonic()
        run_id = uuid.uuid4().hex[:8]
        for node in (0, 1):
            env = clean_env(GLOO_SOCKET_IFNAME=lab.iface(node))
            launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=1",
                        f"--max-restarts={restarts}", "--monitor-interval=0.1"]  # fmt: skip
            if mode == "ft":
                env.update(
                    TANDEM_REPLICA_GROUP=str(node), TANDEM_REPLICA_GROUPS="2", TORCHFT_LIGHTHOUSE=self.url
                )
                launcher += ["--standalone"]
                script = ["--min-replicas", str(min_replicas)]
            else:
                launcher += ["--nnodes=2", "--rdzv-backend=c10d", f"--rdzv-endpoint={lab.addr(0)}:{RDZV_PORT}",
                             f"--rdzv-id={run_id}", f"--local-addr={lab.addr(node)}"]  # fmt: skip
                launcher += ["--rdzv-conf=is_host=1"] if node == 0 else []
                script = ["--plain"]
            argv = [*launcher, SCRIPT, str(out), "--stop-file", str(self.stop_file), *script, *script_args]
            with open(self.log(node), "w") as log:
                self.procs.append(lab.popen(node, argv, stdout=log, stderr=subprocess.STDOUT, env=env))

    def log(self, node: int) -> Path:
        return self.out / f"node{node}.log"

    def start_lighthouse(self, port: int = 0) -> str:
        """Start (or restart, on `port`) the lighthouse on node0; its URL."""
        url_file = self.out / "lighthouse.url"
        if url_file.exists():
            url_file.unlink()
        argv = [sys.executable, "-m", "trainer", "lighthouse", "--bind", f"{self.lab.addr(0)}:{port}",
                "--min-replicas", str(self.min_replicas), "--heartbeat-timeout-ms", str(self.heartbeat_ms),
                "--join-timeout-ms", "10000", "--address-file", str(url_file)]  # fmt: skip
        log = open(self.out / "lighthouse.log", "a")  # noqa: SIM115 (the process keeps it)
        self.lighthouse = self.lab.popen(0, argv, stdout=log, stderr=subprocess.STDOUT, env=clean_env())
        deadline = time.monotonic() + 60
        while not url_file.exists():
            if self.lighthouse.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"the lighthouse did not start: {(self.out / 'lighthouse.log').read_text()}"
                )
            time.sleep(0.1)
        return url_file.read_text().strip()

    def kill_lighthouse(self) -> None:
        assert self.lighthouse is not None
        os.killpg(self.lighthouse.pid, signal.SIGKILL)
        self.lighthouse.wait(timeout=10)

    def output(self, node: int) -> str:
        return self.log(node).read_text(errors="replace")

    def steps(self, node: int) -> list[Step]:
        return [Step.parse(line) for line in self.output(node).splitlines() if line.startswith("STEP ")]

    def last(self, node: int) -> Step | None:
        steps = self.steps(node)
        return steps[-1] if steps else None

    def wait_for(self, node: int, what: str, timeout: float, after: int = 0) -> float:
        """Seconds since the job started when `what` appears in `node`'s output (past character `after`)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if what in self.output(node)[after:]:
                return time.monotonic() - self.start
            if self.procs[node].poll() is not None:
                break
            time.sleep(0.1)
        raise AssertionError(
            f"node{node}: {what!r} did not appear within {timeout:.0f}s:\n{self.output(node)[-4000:]}"
        )

    def wait_step(self, node: int, gs: int, timeout: float) -> Step:
        """The first STEP line of `node` at global step >= gs, waiting up to `timeout`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for s in self.steps(node):
                if s.gs >= gs:
                    return s
            if self.procs[node].poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(
            f"node{node} did not reach step {gs} within {timeout:.0f}s:\n{self.output(node)[-4000:]}"
        )

    def worker_pid(self, node: int) -> int:
        """The pid of `node`'s newest training worker (the script prints one WORKER line as it starts)."""
        lines = [line for line in self.output(node).splitlines() if line.startswith("WORKER ")]
        assert lines, self.output(node)[-3000:]
        return int(lines[-1].rsplit("pid=", 1)[1])

    def kill_worker(self, node: int) -> int:
        """SIGKILL the training worker of `node` (its torchrun agent restarts it); its pid."""
        pid = self.worker_pid(node)
        os.kill(pid, signal.SIGKILL)
        return pid

    def stop_at(self, gs: int) -> None:
        """Both groups stop after global step `gs`."""
        tmp = self.stop_file.with_suffix(".tmp")
        tmp.write_text(str(gs))
        tmp.replace(self.stop_file)

    def wait(self, timeout: float) -> list[int | None]:
        """Both agents' exit codes (None: killed at the deadline); the lighthouse is stopped."""
        deadline = time.monotonic() + timeout
        codes: list[int | None] = []
        for proc in self.procs:
            try:
                codes.append(proc.wait(timeout=max(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
                codes.append(None)
        if self.lighthouse is not None and self.lighthouse.poll() is None:
            os.killpg(self.lighthouse.pid, signal.SIGTERM)
            self.lighthouse.wait(timeout=10)
        return codes
