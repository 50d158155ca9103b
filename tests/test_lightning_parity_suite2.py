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


OLD_NAMES = [
    ("PrecisionPlugin", (), "Precision"),
    ("DoublePrecisionPlugin", (), "DoublePrecision"),
    ("HalfPrecisionPlugin", (), "HalfPrecision"),
    ("MixedPrecisionPlugin", ("bf16-mixed", "cpu"), "MixedPrecision"),
    ("FSDPPrecisionPlugin", ("bf16-mixed",), "FSDPPrecision"),
    ("FSDPMixedPrecisionPlugin", ("bf16-mixed", "cpu"), "FSDPPrecision"),
]


@pytest.mark.parametrize(("old", "args", "new"), OLD_NAMES)
def test_old_precision_plugin_names_warn_and_build_the_new_class_as_lightning(old, args, new):
    """Lightning's pre-2.2 names (its graveyard keeps them) warn a deprecation and build an instance of the new
    class with the same precision; Tandem's names do the same."""
    import pytorch_lightning.plugins as theirs

    import trainer.plugins as ours

    got = {}
    for side, module in (("lightning", theirs), ("tandem", ours)):
        with pytest.warns(DeprecationWarning):
            plugin = getattr(module, old)(*args)
        assert isinstance(plugin, getattr(module, new))
        got[side] = getattr(plugin, "precision", None)
    assert got["lightning"] == got["tandem"]


def test_deprecated_strategy_keywords_as_lightning():
    """`DDPStrategy.is_distributed` warns and is True; FSDPStrategy's deprecated `activation_checkpointing` with
    the policy too is a ValueError, alone a deprecation; `timeout=timedelta` is the process group's limit."""
    import datetime

    from pytorch_lightning.strategies import DDPStrategy as TheirDDP
    from pytorch_lightning.strategies import FSDPStrategy as TheirFSDP

    from strategies import DDPStrategy, FSDPStrategy

    for ddp in (TheirDDP, DDPStrategy):
        with pytest.warns(DeprecationWarning):
            assert ddp().is_distributed is True
    for fsdp in (TheirFSDP, FSDPStrategy):
        with pytest.raises(ValueError):
            fsdp(activation_checkpointing=torch.nn.Linear, activation_checkpointing_policy={torch.nn.Linear})
    with pytest.warns(DeprecationWarning):
        ours = FSDPStrategy(activation_checkpointing=[torch.nn.Linear])
    assert ours.activation_checkpointing_policy == {torch.nn.Linear}
    limit = datetime.timedelta(seconds=30)
    assert TheirDDP(timeout=limit)._timeout == limit
    assert DDPStrategy(timeout=limit).timeout_s == 30 == FSDPStrategy(timeout=limit).timeout_s
