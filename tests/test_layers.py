"""The layers (docs/concepts.md): `make lint`'s import contracts hold on the code, and fail on a planted upward
import (at module level or inside a function) and on a planted import circle; TYPE_CHECKING imports are free."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINT = os.path.join(os.path.dirname(sys.executable), "lint-imports")
PACKAGES = ("tandem_core", "strategies", "callbacks", "trainer", "tools")


def lint(where: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": where}
    return subprocess.run(
        [LINT, "--no-cache"], cwd=where, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.fixture
def copy(tmp_path):
    for name in PACKAGES:
        shutil.copytree(
            os.path.join(ROOT, name), tmp_path / name, ignore=shutil.ignore_patterns("__pycache__")
        )
    shutil.copy(os.path.join(ROOT, "pyproject.toml"), tmp_path)
    return tmp_path


def plant(path, line: str) -> None:
    with open(path, "a") as f:
        f.write(f"\n\n{line}\n")


def test_the_code_keeps_both_contracts():
    out = lint(ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "2 kept, 0 broken" in out.stdout


@pytest.mark.parametrize(
    "file, line, broken",
    [
        (
            "strategies/single.py",
            "from trainer.trainer import Trainer  # noqa",
            "strategies.single -> trainer",
        ),
        ("strategies/ddp.py", "def f():\n    import callbacks.base", "strategies.ddp -> callbacks.base"),
        (
            "callbacks/timer.py",
            "def f():\n    from trainer.loop import fit",
            "callbacks.timer -> trainer.loop",
        ),
        (
            "tandem_core/errors.py",
            "def f():\n    import strategies.batch",
            "tandem_core.errors -> strategies",
        ),
    ],
)
def test_an_upward_import_breaks_the_layers(copy, file, line, broken):
    plant(copy / file, line)
    out = lint(str(copy))
    assert out.returncode != 0
    assert "Layers: trainer -> callbacks -> strategies -> tandem_core, never upward BROKEN" in out.stdout
    assert broken.split(" -> ")[0] in out.stdout and broken.split(" -> ")[1] in out.stdout


def test_an_import_circle_inside_a_package_breaks_the_other_contract(copy):
    plant(copy / "tandem_core/errors.py", "def f():\n    from tandem_core import views")
    plant(copy / "tandem_core/views.py", "from tandem_core.errors import TandemError  # noqa")
    out = lint(str(copy))
    assert out.returncode != 0
    assert "No import circle between modules BROKEN" in out.stdout
    assert "tandem_core.errors -> tandem_core.views -> tandem_core.errors" in out.stdout or (
        "tandem_core.views -> tandem_core.errors -> tandem_core.views" in out.stdout
    )


def test_type_checking_imports_may_point_anywhere(copy):
    plant(
        copy / "strategies/single.py",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import trainer",
    )
    out = lint(str(copy))
    assert out.returncode == 0, out.stdout
