"""tools/lightning_suite's alias: Lightning's public names resolve to Tandem's own objects (names only),  a name
Tandem lacks is a stand-in that fails on use (a Lightning environment flag is the installed Lightning's value), and the real-Lightning mode gives Lightning's very modules."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from conftest import ROOT

pytestmark = pytest.mark.slow  # two fresh interpreters importing Lightning

CHECK = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, "tools/lightning_suite")
    import alias
    alias.install(sys.argv[1])
    from lightning.pytorch import LightningModule, Trainer
    from lightning.pytorch.callbacks import EarlyStopping
    from lightning.pytorch.callbacks.early_stopping import EarlyStoppingReason
    from lightning.pytorch.demos.boring_classes import BoringModel
    from lightning.pytorch.callbacks.progress.rich_progress import Progress  # rich's, which both bars draw with
    from lightning.pytorch.callbacks.throughput_monitor import get_available_flops  # where the monitor asks
    print(LightningModule.__module__, Trainer.__module__, EarlyStopping.__module__, EarlyStoppingReason.__module__,
          BoringModel.__module__, Progress.__module__, get_available_flops.__module__)
    from lightning.pytorch.loops import _FitLoop
    from lightning.fabric.utilities.imports import _TORCH_GREATER_EQUAL_2_6
    print(_TORCH_GREATER_EQUAL_2_6)
    try:
        _FitLoop()
    except BaseException as e:  # a stand-in's AbsentName is no Exception: nothing swallows it
        print(type(e).__name__ == "AbsentName" and "refused")
    """
)


def _run(mode: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", CHECK, mode], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_tandem_mode_maps_public_names_to_tandem_objects():
    assert _run("tandem") == ["trainer.task.base", "trainer.trainer", "callbacks.early_stopping",
                              "callbacks.early_stopping", "trainer.demos", "rich.progress", "callbacks.throughput.meter", "True",
                              "refused"]  # fmt: skip


def test_lightning_mode_gives_lightnings_own_modules():
    got = _run("lightning")
    assert got[:8] == ["pytorch_lightning.core.module", "pytorch_lightning.trainer.trainer",
                       "pytorch_lightning.callbacks.early_stopping", "pytorch_lightning.callbacks.early_stopping",
                       "pytorch_lightning.demos.boring_classes", "rich.progress",
                       "lightning_fabric.utilities.throughput", "True"]  # fmt: skip
    assert "refused" not in got  # Lightning has its loops


RELAXED = textwrap.dedent(
    """
    import warnings
    import pytest
    import torch
    from lightning.pytorch.utilities.warnings import PossibleUserWarning

    def test_other_words():
        with pytest.warns(UserWarning, match="resuming"):
            warnings.warn("other words", UserWarning)

    def test_a_generic_hint():
        with pytest.warns(UserWarning, match="resuming"):
            warnings.warn("few workers", PossibleUserWarning)

    def test_a_hint_awaited():
        with pytest.warns(PossibleUserWarning, match="resuming"):
            warnings.warn("few workers", PossibleUserWarning)

    def test_torchs_own():
        with pytest.warns(UserWarning, match="resuming"):
            warnings.warn_explicit("a warning of torch", UserWarning, torch.nn.functional.__file__, 1)
    """
)


def test_the_runners_relaxed_warns_takes_other_words_but_no_generic_hint_or_torchs_own(tmp_path):
    """A relaxed pytest.warns(match=...) passes on a warning of the awaited class in other words, never on a
    PossibleUserWarning (unless awaited) or a warning from torch's own package: those stand in for nothing."""
    (tmp_path / "test_relaxed.py").write_text(RELAXED)
    out, suite = tmp_path / "rows.jsonl", f"{ROOT}/tools/lightning_suite"
    env = dict(os.environ, LIGHTNING_SUITE_MODE="tandem", LIGHTNING_SUITE_OUT=str(out))
    env["PYTHONPATH"] = os.pathsep.join([f"{suite}/site", suite, ROOT])
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "plugin", "-o", "addopts=",
           "--noconftest", "-p", "shims", "test_relaxed.py"]  # fmt: skip
    subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, timeout=120)
    rows = {
        json.loads(line)["nodeid"].split("::")[1]: json.loads(line) for line in out.read_text().splitlines()
    }
    got = {name: (row["outcome"], row["relaxed"]) for name, row in rows.items()}
    assert got == {
        "test_other_words": ("passed", True),
        "test_a_generic_hint": ("failed", False),
        "test_a_hint_awaited": ("passed", True),
        "test_torchs_own": ("failed", False),
    }
