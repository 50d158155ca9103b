"""The network lab itself (benchmarks/lab.py): two isolated nodes, a rate limit that holds, a link that cuts
and comes back, and no namespace left behind: not after down(), a failed build, a killed owner, or the CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
from netlab import ROOT, clean_env, lab_fixture

from benchmarks.lab import (
    ADDRS,
    Lab,
    LabError,
    namespaces,
    rate_bytes_per_s,
    sweep_stale,
    throughput,
)

pytestmark = pytest.mark.slow  # the two-node network lab: make test-slow

LAB_CLI = os.path.join(ROOT, "benchmarks", "lab.py")
# connect to node1's address from node0 with a short timeout; prints "ok" or the error's class name
CONNECT = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2).close()
    print("ok")
except OSError as e:
    print(type(e).__name__)
"""
LISTEN = "import socket, sys, time\ns = socket.create_server((sys.argv[1], 29401))\nprint('up', flush=True)\ntime.sleep(60)"


@pytest.fixture
def lab() -> Iterator[Lab]:
    yield from lab_fixture()


def test_two_nodes_see_only_each_other(lab):
    for node in (0, 1):
        addrs = lab.run(node, ["ip", "-4", "-o", "addr", "show"], timeout=10).stdout
        assert f"{ADDRS[node]}/30" in addrs and "127.0.0.1/8" in addrs
        assert ADDRS[1 - node] not in addrs
        routes = [
            r.strip() for r in lab.run(node, ["ip", "-4", "route", "show"], timeout=10).stdout.splitlines()
        ]
        assert routes == [f"10.213.7.0/30 dev {lab.iface(node)} proto kernel scope link src {ADDRS[node]}"]
        # a route lookup only (no packet): an address outside the /30 has no way out
        lookup = lab.run(node, ["ip", "route", "get", "192.0.2.1"], timeout=10)
        assert lookup.returncode != 0 and "unreachable" in lookup.stderr.lower()
    host_links = subprocess.run(
        ["ip", "-o", "link", "show"], capture_output=True, text=True, timeout=10
    ).stdout
    assert (
        lab.iface(0) not in host_links and lab.iface(1) not in host_links
    )  # nothing in the host's namespace


def test_rate_limit_holds_on_the_link(lab):
    free = throughput(lab, nbytes=8 << 20)
    lab.set_rate("100mbit")
    limited = throughput(lab, nbytes=4 << 20)
    assert limited <= 1.1 * rate_bytes_per_s("100mbit"), f"{limited * 8 / 1e6:.1f} Mbit/s"
    assert limited >= 0.5 * rate_bytes_per_s("100mbit"), f"{limited * 8 / 1e6:.1f} Mbit/s"
    assert free > 2 * limited, f"unlimited {free * 8 / 1e6:.0f} Mbit/s"
    lab.set_rate(None)
    assert throughput(lab, nbytes=8 << 20) > 2 * limited


def test_cut_link_blocks_and_restore_reconnects(lab):
    server = lab.popen(1, [sys.executable, "-c", LISTEN, lab.addr(1)], stdout=subprocess.PIPE)
    assert server.stdout is not None and server.stdout.readline().strip() == "up"

    def connect() -> str:
        return lab.run(0, [sys.executable, "-c", CONNECT, lab.addr(1), "29401"], timeout=30).stdout.strip()

    assert connect() == "ok"
    lab.cut(1)
    assert connect() in ("TimeoutError", "OSError", "ConnectionRefusedError")
    lab.restore(1)
    assert connect() == "ok"


def test_down_removes_both_namespaces_and_is_idempotent(lab):
    assert set(lab.nodes) <= set(namespaces())
    lab.down()
    lab.down()
    assert not set(lab.nodes) & set(namespaces())


def test_a_failed_build_leaves_nothing_behind(lab):
    tag = f"p{os.getpid()}-failed"
    with pytest.raises(LabError, match="rate"):
        Lab.up("0bit", tag=tag)  # passes the form check, refused by tc after both namespaces exist
    assert not [ns for ns in namespaces() if tag in ns]
    with pytest.raises(LabError, match="of the form"):
        Lab.up("fast")


def test_a_lab_whose_owner_was_killed_is_swept(lab):
    code = "from benchmarks.lab import Lab\nlab = Lab.up()\nprint(lab.nodes[0], flush=True)\nimport os\nos._exit(0)"
    child = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=clean_env()
    )
    orphan = child.stdout.strip()
    assert orphan in namespaces(), child.stderr
    assert orphan in sweep_stale()
    assert orphan not in namespaces()
    assert set(lab.nodes) <= set(namespaces())  # a live owner's lab is left alone


def test_cli_up_status_cut_down(lab, tmp_path):  # `lab`: skip where no lab can be built
    env = clean_env(TANDEM_LAB_STATE=str(tmp_path / "lab.json"), TANDEM_LAB_TAG=f"p{os.getpid()}-cli")

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, LAB_CLI, *args], capture_output=True, text=True, timeout=60, env=env
        )

    try:
        up = cli("up", "--rate", "1gbit")
        assert up.returncode == 0, up.stderr
        assert "10.213.7.1" in up.stdout
        assert cli("up").returncode == 1  # one lab per state file
        status = cli("status").stdout
        assert "tbf" in status and "rate 1Gbit" in status
        assert cli("cut", "node1").returncode == 0
        assert "state DOWN" in cli("exec", "node1", "--", "ip", "link", "show", "lab1").stdout
        assert cli("restore", "node1").returncode == 0
        assert cli("exec", "node0", "--", "true").returncode == 0
    finally:
        down = cli("down")
    assert down.returncode == 0, down.stderr
    assert not any(f"p{os.getpid()}-cli" in ns for ns in namespaces())
    assert not (tmp_path / "lab.json").exists()
