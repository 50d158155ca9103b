"""Ctrl-C at a random batch of fit, validate, test and predict as real processes: one process and ddp x2,
from inside (every rank's hook sends itself SIGINT) and from the terminal's process group (rank 0's hook sends
SIGINT to the group the job was started in, as Ctrl-C in a terminal does: under Tandem that group holds the
launcher, which passes it on to the workers). The same script runs under Lightning 2.6 (tests/scripts/ctrl_c.py).

Checked for each: the hooks and their arguments are Lightning's up to the interrupted batch (rank 0's record; in
Lightning, rank 0 kills the other ranks), both end in the callbacks' and the DataModule's on_exception with the
KeyboardInterrupt; Tandem's hooks after that point are those of Lightning's uninterrupted run until the ranks agree
to stop (the next step boundary; under ddp two later, or the end of the epoch or evaluation if it comes first: the
batch drawn is often one of the last two of its pass), then fit's checkpoint; every Tandem rank records the same
hooks with the same arguments, the KeyboardInterrupt included, and exits 130, so does the job; fit's last.ckpt
holds the stop step and that step's weights; the launcher reports an interrupt, never a failed worker. Lightning
exits 1 and saves nothing (the documented difference)."""

from __future__ import annotations

import concurrent.futures
import json
import os
import random
import re
import subprocess
import sys
import time
from typing import Any

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "scripts"))
import ctrl_c  # noqa: E402

from trainer.checkpoint import load  # noqa: E402

SCRIPT = os.path.join(HERE, "scripts", "ctrl_c.py")
STAGES = ("fit", "validate", "test", "predict")
# batches each rank runs: fit 2 epochs of 16 (one process) or 8 (each of 2 ranks); evaluation 8 or 4
BATCHES = {("fit", 1): 32, ("fit", 2): 16}


def _batches(stage: str, devices: int) -> int:
    return BATCHES.get((stage, devices), 8 // devices)


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONWARNINGS": "ignore", "PL_DISABLE_FORK": "1"}
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                "CTRL_C_GROUP", "TANDEM_GLOBAL_SEED", "PL_GLOBAL_SEED"):  # fmt: skip
        env.pop(var, None)
    return env


def _run(framework: str, stage: str, at: int, mode: str, devices: int, out: Any) -> dict[str, Any]:
    """One job, started in a process group of its own (a terminal's); its exit status, output, each rank's
    record and wall time."""
    out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, SCRIPT, framework, stage, str(at), mode, str(devices), str(out)],
        capture_output=True,
        text=True,
        timeout=240,
        env=_env(),
        start_new_session=True,
    )
    ranks = {}
    for rank in range(devices):
        path = out / f"hooks-rank{rank}.json"
        if path.exists():
            ranks[rank] = json.loads(path.read_text())
    return {
        "code": proc.returncode,
        "err": proc.stdout + proc.stderr,
        "ranks": ranks,
        "s": time.monotonic() - start,
    }


CONFIGS = [(1, "group"), (2, "inside"), (2, "group")]  # one process "inside": tests/test_ctrl_c.py
# Lightning's rank-0 record of a whole stage, by (stage, devices)
_UNINTERRUPTED: dict[tuple[str, int], list[Any]] = {}


def _uninterrupted(stage: str, devices: int, out: Any) -> list[Any]:
    """Lightning's record (rank 0) of the stage run without a Ctrl-C: made once for both modes."""
    if (stage, devices) not in _UNINTERRUPTED:
        ref = _run("lightning", stage, -1, "inside", devices, out / f"full-{stage}")
        assert ref["code"] == 0, ref["err"][-3000:]
        _UNINTERRUPTED[(stage, devices)] = ref["ranks"][0]["record"]
    return _UNINTERRUPTED[(stage, devices)]


def _first_difference(a: list[Any], b: list[Any]) -> Any:
    """Where two records part: (index, a's hook, b's hook), or their lengths and ends."""
    found = next(((i, x, y) for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    return found if found is not None else (len(a), len(b), a[-6:], b[-6:])


@pytest.mark.slow
@pytest.mark.parametrize(("devices", "mode"), [pytest.param(d, m, id=f"{d}-{m}") for d, m in CONFIGS])
def test_ctrl_c_at_a_random_batch_of_every_stage(tmp_path, devices, mode):
    """The four stages of one configuration: Tandem and Lightning, two jobs at a time."""
    ats = {stage: random.randrange(_batches(stage, devices)) for stage in STAGES}
    jobs = [(fw, stage) for stage in STAGES for fw in ("tandem", "lightning")]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        runs = dict(
            zip(
                jobs,
                pool.map(lambda j: _run(j[0], j[1], ats[j[1]], mode, devices, tmp_path / "-".join(j)), jobs),
            )
        )
    walls = {f"{fw} {stage}": round(r["s"], 1) for (fw, stage), r in runs.items()}
    print(f"{devices} process(es), {mode}: interrupted at {ats}; wall s {walls}")
    for stage in STAGES:
        where = f"{stage}, {devices} process(es), {mode}, batch {ats[stage]}"
        ours, theirs = runs[("tandem", stage)], runs[("lightning", stage)]
        assert theirs["code"] == 1 and 0 in theirs["ranks"], (where, theirs["err"][-3000:])
        assert ours["code"] == 130, (where, ours["err"][-3000:])
        assert "failed" not in ours["err"] and "Traceback" not in ours["err"], (where, ours["err"][-3000:])
        if devices > 1:
            assert "[tandem] interrupted" in ours["err"] or "launcher interrupted (Ctrl-C)" in ours["err"], (
                where
            )
        assert sorted(ours["ranks"]) == list(range(devices)), (where, ours["err"][-3000:])
        for rank, seen in ours["ranks"].items():  # every rank ends the same way: its hooks, then exit 130
            assert seen.get("exit") == 130, (where, rank, ours["err"][-3000:])
            assert f"rank {rank} exits with 130" in ours["err"], where
        records = [ours["ranks"][r]["record"] for r in range(devices)]
        for rank, record in enumerate(records[1:], 1):  # the same hooks with the same arguments on every rank
            assert record == records[0], (where, rank, _first_difference(record, records[0]))

        def uninterrupted(stage: str = stage) -> list[Any]:
            return _uninterrupted(stage, devices, tmp_path)

        after = ctrl_c.compare(theirs["ranks"][0]["record"], records[0], uninterrupted, stage)
        print(f"  {where}: Tandem ran {len(after)} hooks after Lightning stopped")
        if stage == "fit":
            stopped = re.findall(
                r"stopping at global step (\d+) after SIGINT; checkpoint saved to (\S+)", ours["err"]
            )
            assert len(stopped) == 1, (where, ours["err"][-3000:])
            ckpt = load(stopped[0][1])
            ended = ours["ranks"][0]
            assert ckpt["global_step"] == int(stopped[0][0]) == ended["step_at_exception"], where
            weights = float(sum(v.double().sum() for v in ckpt["state_dict"].values()))
            assert weights == pytest.approx(ended["weights_at_exception"], rel=1e-12), where
            assert not list((tmp_path / "lightning-fit" / "root").rglob("last.ckpt"))  # Lightning saves none
