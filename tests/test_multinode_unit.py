"""Multi-node pieces without the lab: the key of each start of the workers on torchrun's shared store,
gloo's interface choice, the error translation of a lost connection, and the heartbeat that ends a rank
whose peer went silent."""

from __future__ import annotations

import datetime
import os
import socket
import subprocess
import sys
import threading
import time

import pytest
import torch.distributed as dist

from strategies import attempt, multinode
from strategies.comm import ProcessGroupComm
from strategies.process_group import _attempt_store
from tandem_core.errors import DistributedError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TWO_NODES = {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1", "RANK": "0", "MASTER_PORT": "29999"}


@pytest.fixture
def env(monkeypatch):
    for k in ("GLOO_SOCKET_IFNAME", "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_MAX_RESTARTS"):
        monkeypatch.delenv(k, raising=False)
    for k, v in TWO_NODES.items():
        monkeypatch.setenv(k, v)
    return monkeypatch


def _agree_all(port: int, world: int, ranks_first: bool) -> list[str]:
    """Every rank of one start agrees on its key, in threads, each with its own store client; the other
    ranks start before rank 0 when `ranks_first` (they then read a previous start's key first)."""
    tokens: dict[int, str] = {}

    def rank(r: int) -> None:
        client = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=10))
        tokens[r] = attempt.agree(client, r, world, datetime.timedelta(seconds=10))

    threads = {r: threading.Thread(target=rank, args=(r,)) for r in range(world)}
    order = [*range(1, world), 0] if ranks_first else list(range(world))
    for r in order:
        threads[r].start()
        time.sleep(0.3 if r != 0 and ranks_first else 0)
    for t in threads.values():
        t.join(20)
    return [tokens.get(r, "missing") for r in range(world)]


def test_every_rank_agrees_on_a_fresh_key_each_start_whatever_the_store_holds(store):
    """The store outlives restarts (torchrun's shared store): a previous start's key and answers are there."""
    first = _agree_all(store.port, 3, ranks_first=False)
    assert len(set(first)) == 1 and "missing" not in first
    for _ in range(3):  # restarts: ranks 1 and 2 read the stale key before rank 0 publishes the new one
        again = _agree_all(store.port, 3, ranks_first=True)
        assert len(set(again)) == 1 and "missing" not in again, again
        assert again[0] != first[0]  # never a previous start's key
        first = again


def test_the_key_prefixes_the_group_store_only_under_the_shared_store(env):
    env.setenv("TORCHELASTIC_USE_AGENT_STORE", "False")  # torchrun under TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
    assert _attempt_store(datetime.timedelta(seconds=1)) is None  # rank 0 hosts a fresh store each start


def test_a_missing_rank_is_a_distributed_error_after_the_timeout(store):
    with pytest.raises(DistributedError, match=r"rank\(s\) \[1\] to join"):
        attempt.agree(store, 0, 2, datetime.timedelta(seconds=0.5))


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

    from strategies.checkpoint.io import atomic_save
    from tandem_core.errors import CheckpointError
    from trainer.checkpoint.run import check_same_file_everywhere

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
