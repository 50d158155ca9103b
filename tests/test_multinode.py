"""Two nodes, one torchrun agent each, over the network lab's link: the same weights as one node with two
processes on loopback, with and without a 100mbit limit, and the gradient traffic really crosses the link."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator

import pytest
import torch
from netlab import ALL_SETTINGS, ROOT, TwoNodeJob, lab_fixture, link_bytes, run_one_node

from benchmarks.lab import Lab, rate_bytes_per_s

pytestmark = pytest.mark.slow
SCRIPT = os.path.join(ROOT, "tests", "scripts", "multinode_train.py")
STEPS = 16  # 128 samples, 8 per rank and step, 2 ranks, 2 epochs


@pytest.fixture
def lab() -> Iterator[Lab]:
    yield from lab_fixture()


def _n_params(width: int) -> int:
    return 6 * width + width + width * width + width + width * 3 + 3


def _reference(tmp_path, width: int) -> dict[str, torch.Tensor]:
    out = tmp_path / "one_node.pt"
    argv = [
        SCRIPT,
        str(out),
        str(tmp_path / "one"),
        "--devices",
        "2",
        "--num-nodes",
        "1",
        "--width",
        str(width),
    ]
    ref = run_one_node(argv, timeout=180)
    assert ref.returncode == 0, ref.stderr[-3000:]
    return torch.load(out)


def _two_nodes(lab: Lab, where, width: int, settings: tuple[str, ...] = ALL_SETTINGS, timeout: float = 180):
    """Run the script on both nodes with logs and outputs under `where`; (node results, weights file)."""
    where.mkdir(exist_ok=True)
    out = where / "two_nodes.pt"
    argv = [SCRIPT, str(out), str(where / "root"), "--width", str(width), "--timeout-s", "20"]
    return TwoNodeJob(lab, where, argv, settings).wait(timeout), out


def _fit_seconds(output: str) -> float:
    m = re.search(r"finished at step (\d+) in ([\d.]+)s", output)
    assert m and int(m.group(1)) == STEPS, output[-3000:]
    return float(m.group(2))


def _assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-6, rtol=0, msg=k)


def test_two_nodes_match_one_node_with_two_processes(lab, tmp_path):
    reference = _reference(tmp_path, width=32)
    before = link_bytes(lab, 0)
    results, out = _two_nodes(lab, tmp_path / "lab", width=32)
    for r in results:
        assert r.returncode == 0, f"node{r.node} ({r.seconds:.0f}s):\n{r.output[-3000:]}"
        assert f"rank {r.node}/2 finished at step {STEPS}" in r.output  # c10d gave node0 rank 0
    _assert_same(torch.load(out), reference)
    rx, tx = (after - b for after, b in zip(link_bytes(lab, 0), before))
    # every step's all-reduce moves at least the whole gradient across, one way or the other
    assert rx + tx >= STEPS * 4 * _n_params(32), (rx, tx)


def test_a_100mbit_link_reaches_the_same_weights(lab, tmp_path, record_property):
    width = 512  # ~1 MB of gradient a step: ~0.1 s a step on the wire at 100mbit
    reference = _reference(tmp_path, width)
    free, free_out = _two_nodes(lab, tmp_path / "free", width)
    lab.set_rate("100mbit")
    before = link_bytes(lab, 0)
    limited, limited_out = _two_nodes(lab, tmp_path / "limited", width)
    for r in (*free, *limited):
        assert r.returncode == 0, f"node{r.node} ({r.seconds:.0f}s):\n{r.output[-3000:]}"
    _assert_same(torch.load(free_out), reference)
    _assert_same(torch.load(limited_out), reference)
    rx, tx = (after - b for after, b in zip(link_bytes(lab, 0), before))
    fit_free, fit_limited = _fit_seconds(free[0].output), _fit_seconds(limited[0].output)
    # the limit was in force: node0 could not have sent its bytes faster than the rate allows
    assert fit_limited >= tx / rate_bytes_per_s("100mbit") * 0.9, (fit_limited, tx)
    record_property("fit_s_unlimited", fit_free)
    record_property("fit_s_100mbit", fit_limited)
    record_property("job_s_unlimited", max(r.seconds for r in free))
    record_property("job_s_100mbit", max(r.seconds for r in limited))
    print(
        f"\nwidth {width}: fit {fit_free:.2f}s unlimited, {fit_limited:.2f}s at 100mbit; whole job "
        f"{max(r.seconds for r in free):.1f}s / {max(r.seconds for r in limited):.1f}s; node0 sent {tx / 1e6:.1f} MB"
    )


def test_two_nodes_without_gloo_socket_ifname(lab, tmp_path):
    """The host name resolves to 127.0.0.1 here: Tandem sets GLOO_SOCKET_IFNAME to the lab interface itself."""
    results, out = _two_nodes(lab, tmp_path / "lab", width=32, settings=("is_host", "local_addr"), timeout=60)
    for r in results:
        assert r.returncode == 0, f"node{r.node} ({r.seconds:.0f}s):\n{r.output[-3000:]}"
    assert out.exists()


def test_a_loopback_master_addr_is_named_not_a_store_timeout(lab, tmp_path):
    """Without --local-addr torch hands the host name (127.0.0.1 here) to every node as MASTER_ADDR."""
    results, _ = _two_nodes(lab, tmp_path / "lab", width=32, settings=("is_host",), timeout=90)
    for r in results:
        assert r.returncode not in (0, None), f"node{r.node} ({r.seconds:.0f}s):\n{r.output[-3000:]}"
        assert "--local-addr" in r.output and "DistributedError" in r.output, r.output[-3000:]
