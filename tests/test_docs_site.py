"""`make docs`: the site builds from docs/ and the docstrings; every public name has a docstring; the build fails
on a broken internal link and on a public name without a docstring; the Trainer page lists every option."""

from __future__ import annotations

import dataclasses
import html
import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))

from docstrings import undocumented  # noqa: E402

MKDOCS = os.path.join(os.path.dirname(sys.executable), "mkdocs")


def test_every_public_name_has_a_docstring():
    assert undocumented() == []


def test_a_public_name_without_a_docstring_is_found(tmp_path, monkeypatch):
    pkg = tmp_path / "planted"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        '__all__ = ["Good", "Bare"]\n'
        'class Good:\n    """Documented."""\n    def hook(self):\n        """A hook."""\n'
        "class Bare(Good):\n    def hook(self):\n        pass\n    def new(self):\n        pass\n"
        "    @property\n    def size(self):\n        return 1\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert undocumented(("planted",)) == ["planted.Bare", "planted.Bare.new", "planted.Bare.size"]


def build(where) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(where)}
    return subprocess.run(
        [MKDOCS, "build", "--strict"], cwd=where, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow
@pytest.mark.skipif(
    not os.path.exists(MKDOCS), reason="the docs extra is not installed (make docs installs it)"
)
def test_the_site_builds_and_fails_on_a_broken_link_or_an_undocumented_name(tmp_path):
    for name in ("docs", "tools", "tandem_core", "strategies", "callbacks", "trainer"):
        shutil.copytree(
            os.path.join(ROOT, name), tmp_path / name, ignore=shutil.ignore_patterns("__pycache__")
        )
    shutil.copy(os.path.join(ROOT, "mkdocs.yml"), tmp_path)
    out = build(tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    page = html.unescape(re.sub(r"<[^>]+>", "", (tmp_path / "site/api/trainer/index.html").read_text()))
    from trainer.options import TrainerConfig

    for f in dataclasses.fields(TrainerConfig):  # every option, with its doc, on the Trainer's page
        assert f"{f.name} ({f.type})" in page and f.metadata["doc"] in page, f.name

    quickstart = tmp_path / "docs/quickstart.md"
    text = quickstart.read_text()
    quickstart.write_text(text + "\nSee [the missing page](no_such_page.md).\n")
    out = build(tmp_path)
    assert out.returncode != 0 and "no_such_page.md" in out.stdout + out.stderr
    quickstart.write_text(text)

    timer = tmp_path / "callbacks/timer.py"
    timer.write_text(timer.read_text() + "\n\ndef _bare(self):\n    pass\n\n\nTimer.reset_all = _bare\n")
    out = build(tmp_path)
    assert out.returncode != 0 and "callbacks.Timer.reset_all" in out.stdout + out.stderr
