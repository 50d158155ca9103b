"""trainer/task/hparams.py: save_hyperparameters() in a parent's __init__ records the arguments of the whole
super().__init__ chain, as Lightning does (the cases are in tests/scripts/hparams_chain.py; the slow test
runs them under Lightning itself)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "scripts"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "ports"))

import hparams_chain  # noqa: E402

#: what Lightning 2.6.6 records (checked by test_the_cases_are_lightnings)
LIGHTNING = {
    "child": {"_private": 1, "hidden": 4, "lr": 0.1},
    # the child's own arguments too; *args are not recorded, **kwargs are
    "child_with_args": {"_private": 1, "dropout": 0.2, "hidden": 8, "lr": 0.3},
    "datamodule_child": {"batch_size": 16, "root": "data", "workers": 4},
    # a grandchild's value of a name wins over its parent's (width 3, not 4); hidden is the parent's local
    "grandchild": {"_private": 1, "depth": 3, "hidden": 9, "lr": 0.1, "name": "g", "width": 3},
    # `ignore` drops the name in every frame of the chain
    "ignoring_child": {"lr": 0.1, "momentum": 0.9},
    "parent": {"_private": 1, "hidden": 8, "lr": 0.5},
    "renaming": {"_private": 1, "depth": 2, "hidden": 10, "lr": 0.1, "width": 5},
}


def test_a_parent_init_records_the_whole_chain():
    assert hparams_chain.cases() == LIGHTNING


def test_the_child_order_follows_lightning():
    """The parent's names first, then the child's new ones (the order of hparams.yaml)."""
    assert list(hparams_chain.Grandchild().hparams) == ["lr", "hidden", "_private", "width", "depth", "name"]


@pytest.mark.slow
def test_the_cases_are_lightnings(tmp_path):
    pytest.importorskip("pytorch_lightning", reason="the oracle: pip install pytorch-lightning==2.6.6")
    from lightning_check import convert

    script = tmp_path / "hparams_chain.py"
    with open(hparams_chain.__file__) as f:
        script.write_text(convert(f.read()))
    out = subprocess.run(
        [sys.executable, "-W", "ignore", str(script)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(tmp_path),
        env=dict(os.environ, PYTHONPATH=""),  # Tandem's packages off the path
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.split("RESULT ", 1)[1]) == LIGHTNING
