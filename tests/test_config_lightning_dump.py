"""A config written by LightningCLI itself (its parser's dump: what ``--print_config`` prints and
SaveConfigCallback saves as config.yaml, every argument of every class spelt out) builds in Tandem the same
objects as in Lightning."""

from __future__ import annotations

import sys
from typing import Any

import pytest
import yaml

from tests.test_config_lightning import CONFIG, lightning_cli, same_objects
from trainer import config as C

pytest.importorskip("jsonargparse")


@pytest.fixture(autouse=True)
def _keep_argv(monkeypatch):
    monkeypatch.setattr(sys, "argv", list(sys.argv))


def lightning_dump(tmp_path: Any) -> tuple[Any, dict[str, Any]]:
    """LightningCLI on the Lightning twins, and its dump with the class paths of the Tandem twins."""
    cli = lightning_cli(tmp_path, [CONFIG], [])
    text = cli.parser.dump(cli.config, skip_none=False, skip_link_targets=False)
    return cli, yaml.safe_load(text.replace(".PLNet", ".Net").replace(".PLData", ".Data"))


def test_lightning_cli_dump_builds_unchanged(tmp_path, monkeypatch):
    """Everything LightningCLI dumps (Lightning's None defaults, enable_autolog_hparams, model_registry,
    CSVLogger's prefix, ...) builds the objects Lightning builds."""
    monkeypatch.chdir(tmp_path)
    cli, dumped = lightning_dump(tmp_path)
    path = tmp_path / "dumped.yaml"
    path.write_text(yaml.safe_dump(dumped))
    same_objects(cli, C.build(str(path)))
