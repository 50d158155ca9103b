"""strategies/fault_tolerance/manager.py and lighthouse.py against a real torchft lighthouse in this process:
the clear errors (no lighthouse, torchft missing, a quorum below min_replicas after a bounded wait), servers
listening on the given address only, and the `tandem lighthouse` command."""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from strategies.fault_tolerance import FaultTolerance
from strategies.fault_tolerance.lighthouse import main as lighthouse_main
from strategies.fault_tolerance.manager import require_torchft, wait_for_lighthouse
from tandem_core.errors import FaultToleranceError, MissingExtraError
from tests.conftest import ROOT, free_port


def _resolved(port: int, **kwargs):
    return FaultTolerance(
        replica_groups=2, replica_group=0, lighthouse=f"http://127.0.0.1:{port}", **kwargs
    ).resolved()


def _listening(port: int) -> list[str]:
    """The local addresses of the sockets listening on `port` (from /proc/net/tcp and tcp6)."""
    found = []
    for name in ("tcp", "tcp6"):
        path = Path(f"/proc/net/{name}")
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            addr, hex_port = local.rsplit(":", 1)
            if state == "0A" and int(hex_port, 16) == port:  # LISTEN
                found.append("0.0.0.0" if set(addr) == {"0"} else addr)
    return found


def test_no_lighthouse_is_an_error_naming_it_and_how_to_start_one():
    port = free_port()  # nothing listens there
    r = _resolved(port, connect_timeout_s=0.5)
    start = time.monotonic()
    with pytest.raises(
        FaultToleranceError,
        match=rf"no lighthouse reachable at http://127.0.0.1:{port}.*tandem lighthouse --bind",
    ):
        wait_for_lighthouse(r)
    assert time.monotonic() - start < 5


def test_torchft_missing_names_the_extra(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "torchft" else real(name, *a)
    )
    # not installed means not imported either: an earlier test of this process may have imported it
    monkeypatch.delitem(sys.modules, "torchft", raising=False)
    with pytest.raises(MissingExtraError, match=r"pip install 'tandem-trainer\[fault-tolerance\]'"):
        require_torchft()


def test_the_lighthouse_command_refuses_every_interface_and_a_bad_address(capsys):
    assert lighthouse_main(["--bind", "0.0.0.0:0", "--min-replicas", "1"]) == 2
    assert "every interface" in capsys.readouterr().err
    assert lighthouse_main(["--bind", "localhost", "--min-replicas", "1"]) == 2
    assert "give HOST:PORT" in capsys.readouterr().err


needs_torchft = pytest.mark.skipif(
    importlib.util.find_spec("torchft") is None,
    reason="needs the fault-tolerance extra (make test-slow installs it)",
)


def _lighthouse(min_replicas: int):
    require_torchft()  # (quiets torchft's logs of every quorum, as a job's would be)
    from torchft._torchft import LighthouseServer

    return LighthouseServer(
        bind="127.0.0.1:0", min_replicas=min_replicas, join_timeout_ms=100, quorum_tick_ms=50
    )


@pytest.fixture
def lighthouse():
    server = _lighthouse(2)
    yield int(server.address().rsplit(":", 1)[1])
    server.shutdown()


@pytest.mark.slow  # (a few seconds, but it needs the extra, which make test-slow installs)
@needs_torchft
def test_a_quorum_below_min_replicas_waits_bounded_then_fails_with_the_reason(lighthouse):
    from strategies.fault_tolerance.manager import ReplicaManager

    r = _resolved(lighthouse, min_replicas=2, quorum_timeout_s=2, timeout_s=5)
    manager = ReplicaManager(r, 0, 1, torch.device("cpu"), lambda obj: obj, dict, lambda state: None)
    try:
        port = int(manager.manager._manager.address().rsplit(":", 1)[1])
        assert _listening(port) == ["0100007F"]  # 127.0.0.1 only, not every interface (torchft's default)
        start = time.monotonic()
        with pytest.raises(
            FaultToleranceError,
            match=r"no quorum of min_replicas=2 replica group\(s\) within quorum_timeout_s=2s",
        ):
            manager.quorum()
        assert 1.5 < time.monotonic() - start < 15
    finally:
        manager.shutdown()


def _start_lighthouse(tmp_path: Path, min_replicas: int = 1) -> tuple[subprocess.Popen[str], str]:
    """`tandem lighthouse` on 127.0.0.1 and a free port, as a process; (the process, its URL)."""
    url_file = tmp_path / "url"
    env = {**os.environ, "PYTHONPATH": ROOT}
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainer", "lighthouse", "--bind", "127.0.0.1:0", "--min-replicas", str(min_replicas),
         "--address-file", str(url_file)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not url_file.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert url_file.exists(), (
        proc.communicate(timeout=10)[0] if proc.poll() is not None else "no address file"
    )
    return proc, url_file.read_text().strip()


@pytest.mark.slow
@needs_torchft
def test_the_lighthouse_command_listens_on_the_given_address_until_stopped(tmp_path):
    proc, url = _start_lighthouse(tmp_path)
    try:
        port = int(url.rsplit(":", 1)[1])
        assert url == f"http://127.0.0.1:{port}" and _listening(port) == ["0100007F"]
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert "listening on http://127.0.0.1:" in out and "stopped" in out and not (tmp_path / "url").exists()


@pytest.mark.slow
@needs_torchft
def test_a_lighthouse_gone_for_good_stops_the_group_after_the_quorum_timeout(tmp_path):
    from strategies.fault_tolerance.manager import ReplicaManager

    lighthouse, url = _start_lighthouse(tmp_path)  # a process: killed, its connections end with it
    r = _resolved(int(url.rsplit(":", 1)[1]), quorum_timeout_s=3, timeout_s=5)
    manager = ReplicaManager(r, 0, 1, torch.device("cpu"), lambda obj: obj, dict, lambda state: None)
    try:
        manager.quorum()  # a quorum of this group alone (min_replicas=1)
        assert manager.participants == 1 and manager.commit()
        lighthouse.kill()
        lighthouse.communicate(timeout=30)
        start = time.monotonic()
        with pytest.raises(
            FaultToleranceError, match=r"within quorum_timeout_s=3s through the lighthouse at http://127"
        ):
            manager.quorum()
        took = time.monotonic() - start
        assert 2.5 < took < 15, took
        print(f"\nthe lighthouse gone: the next quorum failed after {took:.1f}s (quorum_timeout_s=3)")
    finally:
        manager.shutdown()
