"""Command lines: the `tandem` command (trainer/cli/command.py) and Lightning's `LightningCLI`.

    tandem fit --config config.yaml --trainer.max_epochs=3          # Tandem's command, no script needed
    LightningCLI(MyModel, MyDataModule)                             # a project's main.py, as in Lightning

`LightningCLI` and its companions (`LightningArgumentParser`, `SaveConfigCallback`, `instantiate_class`,
`OptimizerCallable`, ...) are built on jsonargparse, an optional extra (``pip install
'tandem-trainer[cli]'``); they are imported on first use, so `tandem` works without it. Every value a
command line or config file gives them is checked against Tandem's trust rules before anything is built
(trainer/cli/trust.py; docs/configuration.md, "Trust").
"""

from __future__ import annotations

import importlib
from typing import Any

from trainer.cli.command import COMMANDS, PRINT_FLAGS, _parser, lightning_options, main

_LIGHTNING = {
    "LightningCLI": "trainer.cli.lightning",
    "LightningArgumentParser": "trainer.cli.parser",
    "SaveConfigCallback": "trainer.cli.save",
    "ReduceLROnPlateau": "trainer.config.optim",
    "instantiate_class": "trainer.cli.instantiate",
    "instantiate_module": "trainer.cli.instantiate",
    "OptimizerCallable": "trainer.cli.types",
    "LRSchedulerCallable": "trainer.cli.types",
    "LRSchedulerTypeTuple": "trainer.cli.types",
    "LRSchedulerTypeUnion": "trainer.cli.types",
    "LRSchedulerType": "trainer.cli.types",
    "ArgsType": "trainer.cli.types",
}
__all__ = ["COMMANDS", "PRINT_FLAGS", "_parser", "lightning_options", "main", *_LIGHTNING]


def __getattr__(name: str) -> Any:
    module = _LIGHTNING.get(name)
    if module is None:
        raise AttributeError(f"module 'trainer.cli' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
