"""Public behaviour that Lightning's own tests (issue 43, the second suite helper's files) found different, each
compared with Lightning on the same script: to_torchscript's deprecation and errors, ..."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

from trainer import Task

pl = pytest.importorskip("pytorch_lightning")


def _net(base: type) -> Any:
    class Net(base):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 2)

        def forward(self, x):
            return self.layer(x)

    return Net()


def _deprecations(call: Any) -> list[type]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            call()
        except Exception as e:  # the error's kind is compared too
            caught.append(type(e))  # type: ignore[arg-type]
    return [
        w if isinstance(w, type) else w.category
        for w in caught
        if isinstance(w, type) or "torch.jit" not in str(w.message)  # torch's own jit warnings aside
    ]


@pytest.mark.parametrize("call", ["script", "trace", "bad_method", "no_input"])
def test_to_torchscript_is_deprecated_and_refuses_bad_arguments_as_lightning(call):
    """Both warn a DeprecationWarning of their own first (TorchScript is deprecated in torch), then a ValueError
    for a method other than script/trace or a trace without an input; a good call gives the same outputs."""
    seen = {}
    for name, base in (("lightning", pl.LightningModule), ("tandem", Task)):
        torch.manual_seed(0)
        net = _net(base)
        net.example_input_array = None if call == "no_input" else torch.ones(3, 4)
        method = {"bad_method": "temp", "no_input": "trace"}.get(call, call)
        kinds = _deprecations(lambda net=net, method=method: net.to_torchscript(method=method))
        assert issubclass(kinds[0], DeprecationWarning), (name, kinds)
        seen[name] = kinds[1:] and issubclass(kinds[1], ValueError)
        if call in ("script", "trace"):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                out = net.to_torchscript(method=method)(torch.ones(3, 4))
            seen[name] = out.tolist()
    assert seen["lightning"] == seen["tandem"]
