"""Lightning's loggers Tandem does not support (Comet, Neptune, LitLogger): importable, refused when built.

``from lightning.pytorch.loggers import CometLogger`` is common in scripts that choose a logger at run time, so
the import works (and ``isinstance``/``issubclass`` checks against the class too); building one raises a
ConfigError naming the loggers that work. None of these services can be run or tested here without an account.
"""

from __future__ import annotations

from typing import Any

from tandem_core.errors import ConfigError
from trainer.loggers.base import Logger

_SERVICES = {"CometLogger": "Comet", "NeptuneLogger": "Neptune", "LitLogger": "Lightning AI's LitLogger"}


def refusal(name: str) -> str:
    """Why `name` cannot be built, and what to use instead."""
    return (
        f"{name} is not available in Tandem: {_SERVICES[name]} is not supported (it cannot be tested here "
        "without the service). Use WandbLogger, MLFlowLogger, TensorBoardLogger or CSVLogger from "
        "trainer.loggers, or subclass trainer.loggers.Logger (log_metrics, log_hyperparams, finalize)."
    )


class RefusedLogger(Logger):
    """Base of the refused loggers: constructing one raises a ConfigError (`refused_because` says why)."""

    refused_because = ""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise ConfigError(self.refused_because)


def _refused(name: str) -> type[RefusedLogger]:
    doc = f"Lightning's {name}: importable, but building it raises ConfigError ({_SERVICES[name]} is not supported)."
    return type(
        name, (RefusedLogger,), {"refused_because": refusal(name), "__doc__": doc, "__module__": __name__}
    )


CometLogger = _refused("CometLogger")
NeptuneLogger = _refused("NeptuneLogger")
LitLogger = _refused("LitLogger")
