"""What the port tests share: quiet options, weight comparison, a weight snapshot callback, a DDP runner."""

from __future__ import annotations

import importlib
import random
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from callbacks import Callback
from tandem_core.errors import TandemError

#: Trainer options that keep a port's run quiet without changing what it computes
QUIET: dict[str, Any] = dict(enable_progress_bar=False, enable_model_summary=False)


def seed_all(seed: int) -> None:
    """What the reference loops use in place of seed_everything: every global generator seeded."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def weights(module: torch.nn.Module, prefix: str = "") -> dict[str, torch.Tensor]:
    """A detached copy of the state dict entries under `prefix`, with the prefix removed."""
    return {
        k[len(prefix) :]: v.detach().clone() for k, v in module.state_dict().items() if k.startswith(prefix)
    }


def assert_same_weights(
    actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], atol: float = 1e-6
) -> None:
    """Same keys and every tensor within `atol` (parameters and buffers such as BatchNorm statistics)."""
    assert sorted(actual) == sorted(expected), f"keys differ: {sorted(set(actual) ^ set(expected))}"
    worst = {
        k: float((actual[k].double() - expected[k].double()).abs().max())
        for k in expected
        if expected[k].numel()
    }
    bad = {k: v for k, v in worst.items() if not v <= atol}
    assert not bad, f"weights differ by more than {atol}: {bad}"


def differs(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float = 1e-4) -> bool:
    """True if some tensor of `a` and `b` differs by more than `atol` (a sanity check on the references)."""
    return any(float((a[k].double() - b[k].double()).abs().max()) > atol for k in a if a[k].numel())


class FitEndWeights(Callback):
    """Copies the task's weights when fit ends (test(ckpt_path=...) may load other weights afterwards)."""

    def __init__(self) -> None:
        self.state: dict[str, torch.Tensor] | None = None

    def on_fit_end(self, trainer: Any, task: Any) -> None:
        self.state = weights(task)


class LazyPort:
    """A port module imported on first use: a name Tandem lacks then fails the tests that need it with its
    ImportError, instead of stopping the collection of the whole suite."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        return getattr(importlib.import_module(f"tests.ports.{self._name}"), attr)


def run_port(
    rank: int,
    world_size: int,
    module: str,
    overrides: dict[str, Any],
    attrs: tuple[str, ...] = (),
    refusable: bool = False,
) -> dict[str, Any]:
    """Run a port's main() in this rank of a process group (tests/conftest.py run_distributed); return the
    final weights and the model attributes named in `attrs`, or with `refusable` the message of a
    TandemError that refused the run."""
    port = importlib.import_module(f"tests.ports.{module}")
    try:
        model = port.main(**overrides)["model"]
    except TandemError as e:
        if not refusable:
            raise
        return {"refused": str(e)}
    state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    return {"state": state, **{a: getattr(model, a) for a in attrs}}


def nonempty(values: Iterable[Any]) -> list[Any]:
    """The values as a list, asserting there is at least one (a check that ran on nothing proves nothing)."""
    out = list(values)
    assert out, "expected at least one value"
    return out
