"""benchmarks/gpu_check.py (`make gpu-check`) works end to end without a GPU: it says so and exits 0 when there
is no CUDA; its dry run on the CPU runs the checks that mean something there (each one passing against its
reference), skips the CUDA-only ones, keeps going past a failing or hanging check, writes its JSON, and fills
docs' "On a GPU" section from a report."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "gpu_check.py")
sys.path.append(os.path.join(ROOT, "benchmarks"))  # after the repository: benchmarks/ holds a strategies.py

import gpu_check  # noqa: E402


def test_without_cuda_it_says_so_and_exits_0():
    p = subprocess.run([sys.executable, SCRIPT], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "no CUDA device" in p.stdout


def test_the_dry_run_checks_on_the_cpu_and_skips_the_cuda_only_ones(tmp_path, capsys):
    out = tmp_path / "gpu.json"
    names = "defaults,syncs_single,sync_dist,save_load,fork_with_cuda"  # (the slow test below runs them all)
    code = gpu_check.main(["--device", "cpu", "--quick", "--in-process", "--only", names, "--out", str(out)])
    lines = [x for x in capsys.readouterr().out.splitlines() if x.split(" ")[0] in ("PASS", "FAIL", "SKIP")]
    assert code == 0, lines
    assert [x.split(" ")[1].rstrip(":") for x in lines] == names.split(",")  # one line each, in order
    verdicts = {x.split(" ")[1].rstrip(":"): x.split(" ")[0] for x in lines}
    assert verdicts["syncs_single"] == verdicts["fork_with_cuda"] == "SKIP"
    assert all(v == "PASS" for k, v in verdicts.items() if k not in ("syncs_single", "fork_with_cuda"))
    report = json.loads(out.read_text())
    assert report["passed"] == 3 and report["skipped"] == 2 and report["failed"] == 0
    assert report["environment"]["torch"] and report["checks"]["save_load"]["figure"].startswith(
        "max diff 0.0"
    )


def test_a_failing_or_hanging_check_fails_alone(monkeypatch, tmp_path, capsys):
    import gpu_checks

    monkeypatch.setitem(gpu_check.CHECKS, "broken", ("gpu_checks:broken", {}, 60))
    monkeypatch.setitem(gpu_check.CHECKS, "hangs", ("gpu_checks:hangs", {}, 1))
    monkeypatch.setattr(gpu_checks, "broken", lambda ctx: 1 / 0, raising=False)
    monkeypatch.setattr(gpu_checks, "hangs", lambda ctx: __import__("time").sleep(30), raising=False)
    out = tmp_path / "gpu.json"
    code = gpu_check.main(
        ["--device", "cpu", "--in-process", "--only", "broken,hangs,defaults", "--out", str(out)]
    )
    lines = capsys.readouterr().out.splitlines()
    assert code == 1
    assert "FAIL broken: ZeroDivisionError" in lines[0] and "FAIL hangs: TimeoutError" in lines[1]
    assert lines[2].startswith("PASS defaults")


def test_the_docs_summary_is_replaced_between_its_markers(tmp_path):
    docs = tmp_path / "benchmarks.md"
    docs.write_text(f"# B\n\n## On a GPU\n\n{gpu_check.BEGIN}\nnot yet run\n{gpu_check.END}\n\n## After\n")
    report = {
        "environment": {"date": "2026-11-28 10:00 UTC", "device": "NVIDIA H100 80GB HBM3", "torch": "2.13.0", "cuda": "12.8"},
        "checks": {"defaults": {"passed": True, "figure": "root cuda:0"}, "syncs_ddp1": {"passed": False, "figure": "2.00 syncs/step"}},
        "passed": 1, "failed": 1, "skipped": 0,
    }  # fmt: skip
    gpu_check.write_docs(report, str(docs))
    text = docs.read_text()
    assert "not yet run" not in text and "## After" in text and text.count(gpu_check.BEGIN) == 1
    assert (
        "NVIDIA H100 80GB HBM3 (torch 2.13.0" in text
        and "| syncs_ddp1 | **fail** | 2.00 syncs/step |" in text
    )


@pytest.mark.slow
def test_every_check_in_its_own_process_on_the_cpu(tmp_path):
    """The full dry run as `make gpu-check` runs it (one process per check)."""
    out = tmp_path / "gpu.json"
    p = subprocess.run([sys.executable, SCRIPT, "--device", "cpu", "--quick", "--out", str(out)],
                       capture_output=True, text=True, timeout=1200)  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    report = json.loads(out.read_text())
    assert set(report["checks"]) == set(gpu_check.CHECKS) and report["failed"] == 0
