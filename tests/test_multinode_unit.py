"""Multi-node pieces without the lab: the restart-store rule, gloo's interface choice, the error translation
of a lost connection, and the heartbeat that ends a rank whose peer went silent."""

from __future__ import annotations

import datetime
import os
import socket
import subprocess
import sys
import time

import pytest
import torch.distributed as dist

from strategies import multinode
from strategies.comm import ProcessGroupComm
from strategies.process_group import _attempt_store
from trainer.errors import ConfigError, DistributedError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TWO_NODES = {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1", "RANK": "0", "MASTER_PORT": "29999"}


@pytest.fixture
def env(monkeypatch):
    for k in ("GLOO_SOCKET_IFNAME", "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_MAX_RESTARTS"):
        monkeypatch.delenv(k, raising=False)
    for k, v in TWO_NODES.items():
        monkeypatch.setenv(k, v)
    return monkeypatch


def test_multinode_restarts_on_the_shared_store_are_refused(env):
    env.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    env.setenv("TORCHELASTIC_MAX_RESTARTS", "1")
    env.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    with pytest.raises(ConfigError, match="TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"):
        _attempt_store(datetime.timedelta(seconds=1))
    env.setenv("TORCHELASTIC_MAX_RESTARTS", "0")
    multinode.check_attempt_store()  # no restarts: one attempt, any key agrees
    env.setenv("TORCHELASTIC_MAX_RESTARTS", "1")
    env.setenv("LOCAL_WORLD_SIZE", "2")
    multinode.check_attempt_store()  # one node: one agent counts the restarts for every rank


def test_a_fresh_store_per_restart_needs_no_prefix(env):
    env.setenv("TORCHELASTIC_USE_AGENT_STORE", "False")  # torchrun under TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
    env.setenv("TORCHELASTIC_MAX_RESTARTS", "1")
    env.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert _attempt_store(datetime.timedelta(seconds=1)) is None


def test_a_loopback_master_addr_across_nodes_names_local_addr(env):
    env.setenv("MASTER_ADDR", "127.0.0.1")
    with pytest.raises(DistributedError, match="--local-addr"):
        multinode.bind_gloo_interface()


def _non_loopback_ip() -> str | None:
    out = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        ip = line.split()[3].split("/")[0]
        if not ip.startswith("127."):
            return ip
    return None


def test_gloo_binds_the_interface_that_reaches_master_addr(env):
    ip = _non_loopback_ip()
    if ip is None:
        pytest.skip("this machine has no non-loopback IPv4 address")
    env.setenv("MASTER_ADDR", ip)
    env.setattr(socket, "gethostname", lambda: "localhost")  # a host name that resolves to 127.0.0.1
    name = multinode.bind_gloo_interface()
    # the reference: the kernel's own answer for which interface holds that address
    shown = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True).stdout
    expected = next(line.split()[1] for line in shown.splitlines() if f" {ip}/" in line)
    assert name == expected and os.environ["GLOO_SOCKET_IFNAME"] == expected
    env.setenv("GLOO_SOCKET_IFNAME", "mine")
    assert multinode.bind_gloo_interface() is None  # the user's choice stands
    env.setenv("LOCAL_WORLD_SIZE", "2")
    env.delenv("GLOO_SOCKET_IFNAME")
    assert multinode.bind_gloo_interface() is None  # one node: loopback is right


@pytest.mark.parametrize(
    "message",
    [
        "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.1.2.3]:41234",
        "[../third_party/gloo/gloo/transport/tcp/pair.cc:598] Read error [10.1.2.3]:5521: Connection reset by peer",
    ],
)
def test_a_lost_connection_is_a_distributed_error_naming_the_peer(message):
    def fails() -> None:
        raise RuntimeError(message)

    with pytest.raises(DistributedError, match=r"failed at once: the connection to the peer at 10\.1\.2\.3"):
        ProcessGroupComm().run("gradient all-reduce", fails)


def test_a_tcp_timeout_names_the_peer_and_is_not_called_timeout_s():
    def fails() -> None:
        raise RuntimeError(
            "[../gloo/transport/tcp/pair.cc:537] Read error [10.1.2.3]:32671: Connection timed out"
        )

    with pytest.raises(DistributedError, match=r"connection to the peer at 10\.1\.2\.3 timed out in") as e:
        ProcessGroupComm(timeout_s=1800).run("gradient all-reduce", fails)
    assert "within timeout_s" not in str(e.value)


def test_other_errors_pass_through():
    def fails() -> None:
        raise RuntimeError("shape mismatch")

    with pytest.raises(RuntimeError, match="shape mismatch") as info:
        ProcessGroupComm().run("all-gather", fails)
    assert not isinstance(info.value, DistributedError)


BEAT = """
import sys, time
from strategies.heartbeat import Heartbeat
beat = Heartbeat(0, 2, silence_s=float(sys.argv[1]), interval_s=0.2)
beat.start()
time.sleep(float(sys.argv[2]))
beat.stop()
print("ran to the end", flush=True)
"""


def _rank0(port: int, silence: float, lifetime: float) -> subprocess.Popen[str]:
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), PYTHONPATH=ROOT)
    return subprocess.Popen(
        [sys.executable, "-c", BEAT, str(silence), str(lifetime)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.fixture
def store() -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=datetime.timedelta(seconds=10))


def test_a_silent_peer_ends_the_rank_naming_it(store):
    store.set("tandem/heartbeat/host/1", "node-b (10.9.9.9)")
    start = time.monotonic()
    proc = _rank0(store.port, silence=2.0, lifetime=30)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 1, out
    assert "no heartbeat from rank 1 on node-b (10.9.9.9) for 2s" in out
    assert time.monotonic() - start < 15  # not the lifetime: the silence ended it


def test_a_beating_or_finished_peer_is_left_alone(store):
    store.set("tandem/heartbeat/host/1", "node-b (10.9.9.9)")
    proc = _rank0(store.port, silence=2.0, lifetime=8)
    end = time.monotonic() + 3.5
    while time.monotonic() < end:  # rank 1 beats 3.5 s, then is done: 4.5 s silent
        store.add("tandem/heartbeat/1", 1)
        time.sleep(0.2)
    store.set("tandem/heartbeat/done/1", "1")
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0 and "ran to the end" in out, out


def test_srun_across_nodes_counts_as_multinode(env):
    env.delenv("LOCAL_WORLD_SIZE")
    env.setenv("SLURM_NNODES", "2")
    assert multinode.is_multinode()
    env.setenv("SLURM_NNODES", "1")
    assert not multinode.is_multinode()


def _check_resume_file(rank: int, world: int, root: str) -> str:
    """Rank r resumes from root/node{r}/last.ckpt: one file per node, as on nodes without shared storage."""
    from types import SimpleNamespace

    from trainer.checkpoint.io import atomic_save
    from trainer.checkpoint.run import check_same_file_everywhere
    from trainer.errors import CheckpointError

    t = SimpleNamespace(strategy=SimpleNamespace(comm=ProcessGroupComm()))
    here = os.path.join(root, f"node{rank}")
    os.makedirs(here, exist_ok=True)
    if rank == 0:
        atomic_save({"state_dict": {}}, os.path.join(here, "last.ckpt"))
    os.chdir(here)  # a relative path: the same string names each node's own file
    try:
        check_same_file_everywhere(t, "last.ckpt")
    except CheckpointError as e:
        return str(e)
    return "no error"


def test_resume_on_nodes_without_shared_storage_says_so(tmp_path):
    from conftest import run_distributed

    messages = run_distributed(_check_resume_file, str(tmp_path))
    for m in messages:  # every rank gets the same error: none is left waiting in a collective
        assert "missing on rank(s) [1]" in m and "shared by every node" in m, m
