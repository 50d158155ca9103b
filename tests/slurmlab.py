"""A real SLURM for the tests: Debian's slurm-wlm, our own munged, slurmctld and slurmd(s) from a generated
slurm.conf under a temporary directory, on one node (this machine, 127.0.0.1) or on the two nodes of the
network lab (benchmarks/lab.py: one slurmd per namespace, each in a UTS namespace of its own for its node
name). `Slurm.down()` stops every daemon and removes the /etc/hosts lines it added, also after a failure.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOSTS = "/etc/hosts"
HOSTS_TAG = "# tandem-slurm-lab"
DAEMONS = ("munged", "slurmctld", "slurmd")


class SlurmError(RuntimeError):
    """The cluster could not be set up; the message says why."""


def unavailable() -> str | None:
    """Why this machine cannot host the SLURM lab (not root, no apt to install slurm-wlm), or None."""
    if os.name != "posix" or os.geteuid() != 0:
        return "the SLURM lab needs root (it starts munged, slurmctld and slurmd, and may apt-get slurm-wlm)"
    if all(shutil.which(d) or os.path.exists(f"/usr/sbin/{d}") for d in DAEMONS):
        return None
    if shutil.which("apt-get") is None:
        return "slurm-wlm is not installed and there is no apt-get to install it"
    return None


def install() -> None:
    """apt-get install slurm-wlm (with munge) when its daemons are missing; SlurmError if that fails."""
    if all(os.path.exists(f"/usr/sbin/{d}") for d in DAEMONS) and shutil.which("sbatch"):
        return
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    lock = ["-o", "DPkg::Lock::Timeout=600"]
    for argv in (["apt-get", *lock, "update", "-q"], ["apt-get", *lock, "install", "-y", "-q", "slurm-wlm"]):
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=1200)
        if done.returncode != 0:
            raise SlurmError(f"`{' '.join(argv)}` failed ({done.returncode}): {done.stderr.strip()[-800:]}")


class Slurm:
    """One cluster: `Slurm.start(nodes)` with nodes [(name, addr, netns or None)]; the first node's network
    namespace also hosts slurmctld and every client command (`run`, `sbatch`, `job`)."""

    def __init__(self, base: Path, nodes: list[tuple[str, str, str | None]], port: int) -> None:
        self.base, self.nodes, self.port = base, nodes, port
        self.conf = base / "slurm.conf"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.hosts_added = False
        self.lab: Any = None  # the network lab (benchmarks/lab.py) it runs in, if any

    # ----- bring-up -----------------------------------------------------------------------------
    @classmethod
    def start(cls, nodes: list[tuple[str, str, str | None]], port: int = 6917) -> Slurm:
        """Install if needed, write the config, start munged, slurmctld and one slurmd per node; wait for idle."""
        reason = unavailable()
        if reason:
            raise SlurmError(reason)
        install()
        base = Path(tempfile.mkdtemp(prefix="tandem-slurm-"))
        os.chmod(base, 0o755)
        cluster = cls(base, nodes, port)
        try:
            cluster._munge()
            cluster._write_conf()
            if any(ns for _, _, ns in nodes):
                cluster._add_hosts()
            ctl, _, ctl_ns = nodes[0]  # slurmctld checks that its host name is SlurmctldHost's
            ctl_argv = ["slurmctld", "-D", "-i", "-f", str(cluster.conf)]
            cluster._daemon("slurmctld", ctl_argv, ctl_ns, ctl if ctl_ns else None)
            for name, _, ns in nodes:
                cluster._daemon(
                    f"slurmd-{name}", ["slurmd", "-D", "-N", name, "-f", str(cluster.conf)], ns, name
                )
            cluster.wait_idle(60)
        except BaseException:
            cluster.down()
            raise
        return cluster

    def _munge(self) -> None:
        """munged as the munge user, with its own key and socket under the base directory."""
        d = self.base / "munge"
        d.mkdir()
        os.chmod(d, 0o755)  # munged wants its socket directory searchable by all, writable only by itself
        key = d / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        user = pwd.getpwnam("munge")
        for p in (d, key):
            os.chown(p, user.pw_uid, user.pw_gid)
        self.socket = d / "munge.socket"
        argv = [
            "runuser",
            "-u",
            "munge",
            "--",
            "munged",
            "-F",
            f"--socket={self.socket}",
            f"--key-file={key}",
        ]
        argv += [
            f"--pid-file={d / 'munged.pid'}",
            f"--log-file={d / 'munged.log'}",
            f"--seed-file={d / 'seed'}",
        ]
        self._daemon("munged", argv, None, None)
        deadline = time.monotonic() + 20
        while not self.socket.exists():
            if time.monotonic() > deadline:
                raise SlurmError(f"munged did not start: {self._log(d / 'munged.log')}")
            time.sleep(0.1)

    def _write_conf(self) -> None:
        b, (ctl, ctl_addr, _) = self.base, self.nodes[0]
        (b / "state").mkdir()
        cpus = os.cpu_count() or 1
        lines = [
            "ClusterName=tandemlab",
            f"SlurmctldHost={ctl}({ctl_addr})",
            f"SlurmctldPort={self.port}",
            f"SlurmdPort={self.port + 1}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.socket}",
            "SlurmUser=root",
            f"StateSaveLocation={b / 'state'}",
            f"SlurmdSpoolDir={b}/d-%n",
            f"SlurmctldPidFile={b}/ctld.pid",
            f"SlurmdPidFile={b}/d-%n.pid",
            f"SlurmctldLogFile={b}/ctld.log",
            f"SlurmdLogFile={b}/d-%n.log",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "SchedulerType=sched/builtin",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "MpiDefault=none",
            "JobRequeue=1",
            "ReturnToService=2",
            "SlurmdParameters=config_overrides",
            "MinJobAge=600",
            "KillWait=30",
            *(f"NodeName={n} NodeAddr={a} CPUs={cpus} State=UNKNOWN" for n, a, _ in self.nodes),
            "PartitionName=lab Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO",
        ]
        self.conf.write_text("\n".join(lines) + "\n")

    def _add_hosts(self) -> None:
        """The nodes' names must resolve on every node (MASTER_ADDR is the first node's name)."""
        with open(HOSTS, "a") as f:
            for name, addr, _ in self.nodes:
                f.write(f"{addr} {name} {HOSTS_TAG}\n")
        self.hosts_added = True

    def _daemon(self, label: str, argv: list[str], netns: str | None, hostname: str | None) -> None:
        """Start a daemon in the foreground of its own session; in `netns` (nsenter --net: `ip netns exec`
        would remount /sys, where slurmd then finds no cgroup file system), with its own host name."""
        if hostname is not None:
            argv = ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', hostname, *argv]
        if netns is not None:
            argv = ["nsenter", f"--net=/run/netns/{netns}", *argv]
        log = open(self.base / f"{label}.out", "wb")  # noqa: SIM115 (kept open by the child)
        self.procs.append(
            subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=self.env()
            )
        )
        log.close()

    def wait_idle(self, timeout: float) -> None:
        """Until every node is idle (a daemon that died is reported with its log)."""
        deadline = time.monotonic() + timeout
        names = {n for n, _, _ in self.nodes}
        while True:
            for proc in self.procs:
                if proc.poll() is not None:
                    raise SlurmError(f"a SLURM daemon exited ({proc.args}): {self.logs()}")
            out = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], timeout=20, check=False).stdout
            states = dict(line.split() for line in out.splitlines() if len(line.split()) == 2)
            if names <= set(states) and all(states[n] == "idle" for n in names):
                return
            if time.monotonic() > deadline:
                raise SlurmError(f"nodes not idle after {timeout:.0f} s ({states}): {self.logs()}")
            time.sleep(0.3)

    # ----- use ----------------------------------------------------------------------------------
    def env(self, **extra: str) -> dict[str, str]:
        """This environment with SLURM_CONF pointing at the lab's config, without a surrounding job's variables."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TORCHELASTIC_"))}
        for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            env.pop(k, None)
        env.update(SLURM_CONF=str(self.conf), PYTHONUNBUFFERED="1", PYTHONPATH=ROOT, **extra)
        return env

    def command(self, argv: list[str]) -> list[str]:
        """`argv` as run on the first node (its network namespace, where slurmctld listens)."""
        ns = self.nodes[0][2]
        return argv if ns is None else ["nsenter", f"--net=/run/netns/{ns}", *argv]

    def run(
        self, argv: list[str], timeout: float = 30, check: bool = True, **kw: Any
    ) -> subprocess.CompletedProcess[str]:
        kw.setdefault("env", self.env())
        done = subprocess.run(self.command(argv), capture_output=True, text=True, timeout=timeout, **kw)
        if check and done.returncode != 0:
            raise SlurmError(f"`{' '.join(argv)}` failed ({done.returncode}): {done.stderr.strip()}")
        return done

    def sbatch(self, script: str, *options: str, env: dict[str, str] | None = None) -> int:
        """Submit `script` (the text of a batch script) with sbatch's `options`; the job id."""
        path = Path(tempfile.mkstemp(prefix="job-", suffix=".sh", dir=self.base)[1])
        path.write_text(script)
        done = self.run(["sbatch", "--parsable", *options, str(path)], env=env or self.env())
        return int(done.stdout.strip().split(";")[0])

    def job(self, job_id: int) -> dict[str, str]:
        """`scontrol show job` as a dict (JobState, Restarts, Requeue, ExitCode, ...)."""
        out = self.run(["scontrol", "-o", "show", "job", str(job_id)]).stdout
        return dict(re.findall(r"(\w+)=(\S*)", out))

    def wait_job(
        self, job_id: int, states: tuple[str, ...], timeout: float, restarts: int | None = None
    ) -> dict[str, str]:
        """Until the job is in one of `states` (and has been requeued `restarts` times); its record."""
        deadline = time.monotonic() + timeout
        while True:
            info = self.job(job_id)
            if info.get("JobState") in states and (
                restarts is None or int(info.get("Restarts", 0)) >= restarts
            ):
                return info
            if time.monotonic() > deadline:
                raise SlurmError(f"job {job_id} not in {states} after {timeout:.0f} s: {info}")
            time.sleep(0.2)

    def start_now(self, job_id: int) -> None:
        """A requeued job waits for a BeginTime SLURM sets; start it as soon as a node is free."""
        self.run(["scontrol", "update", f"jobid={job_id}", "StartTime=now"])

    def cancel(self, job_id: int) -> None:
        self.run(["scancel", str(job_id)], check=False)

    def logs(self, tail: int = 1500) -> str:
        parts = [
            f"{p.name}: {self._log(p, tail)}"
            for p in sorted(self.base.glob("*.log")) + sorted(self.base.glob("*.out"))
        ]
        return "\n".join(parts)

    @staticmethod
    def _log(path: Path, tail: int = 1500) -> str:
        try:
            return path.read_text(errors="replace")[-tail:]
        except OSError:
            return "(no log)"

    # ----- tear-down ----------------------------------------------------------------------------
    def down(self) -> None:
        """Cancel every job, stop the daemons (slurmd, slurmctld, munged: last started, first stopped),
        remove our /etc/hosts lines and the directory; idempotent."""
        if self.procs and self.procs[0].poll() is None and len(self.procs) > 1:
            with contextlib.suppress(Exception):
                self.run(["scancel", "--full", "-u", "root"], timeout=10, check=False)
        for proc in reversed(self.procs):
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=10)
        self._kill_leftover_steps()
        if self.hosts_added:
            _remove_hosts_lines()
            self.hosts_added = False
        shutil.rmtree(self.base, ignore_errors=True)

    def _kill_leftover_steps(self) -> None:
        """slurmstepd and job processes run in sessions of their own: end those started from our spool dirs."""
        for stat in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                cmd = stat.read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            if str(self.base).encode() in cmd or (b"slurmstepd" in cmd and str(self.conf).encode() in cmd):
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(stat.parent.name), signal.SIGKILL)


def _remove_hosts_lines() -> None:
    with open(HOSTS, "r+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        kept = [line for line in f.readlines() if HOSTS_TAG not in line]
        f.seek(0)
        f.truncate()
        f.writelines(kept)
