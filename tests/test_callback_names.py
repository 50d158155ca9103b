"""callbacks/__init__.py: every name of Lightning 2.6's callbacks package, with Lightning's constructor arguments."""

from __future__ import annotations

import inspect

import pytest

import callbacks

# lightning.pytorch.callbacks.__all__ in Lightning 2.6.6 (the 26 names a Lightning project may import)
LIGHTNING_26 = [
    "BackboneFinetuning", "BaseFinetuning", "BasePredictionWriter", "BatchSizeFinder", "Callback", "Checkpoint",
    "DeviceStatsMonitor", "EMAWeightAveraging", "EarlyStopping", "GradientAccumulationScheduler",
    "LambdaCallback", "LearningRateFinder", "LearningRateMonitor", "ModelCheckpoint", "ModelPruning",
    "ModelSummary", "OnExceptionCheckpoint", "ProgressBar", "RichModelSummary", "RichProgressBar",
    "SpikeDetection", "StochasticWeightAveraging", "TQDMProgressBar", "ThroughputMonitor", "Timer",
    "WeightAveraging",
]  # fmt: skip


def test_every_lightning_callback_name_imports():
    missing = [n for n in LIGHTNING_26 if not hasattr(callbacks, n)]
    assert not missing, missing
    assert issubclass(callbacks.TQDMProgressBar, callbacks.ProgressBar)
    assert issubclass(callbacks.ModelCheckpoint, callbacks.Checkpoint)


def test_the_list_is_lightnings():
    pl_callbacks = pytest.importorskip("pytorch_lightning.callbacks", reason="Lightning is the oracle here")
    assert sorted(pl_callbacks.__all__) == sorted(LIGHTNING_26)


@pytest.mark.parametrize("name", LIGHTNING_26)
def test_constructor_arguments_are_lightnings(name):
    pl_callbacks = pytest.importorskip("pytorch_lightning.callbacks", reason="Lightning is the oracle here")
    theirs = inspect.signature(getattr(pl_callbacks, name).__init__).parameters
    ours = inspect.signature(getattr(callbacks, name).__init__).parameters
    takes_any = any(
        q.kind is q.VAR_KEYWORD for q in ours.values()
    )  # LambdaCallback(**hooks) checks names itself
    missing = [p for p in theirs if p not in ours and theirs[p].kind is not inspect.Parameter.VAR_KEYWORD]
    assert takes_any or not missing, f"{name} lacks Lightning's argument(s) {missing}"
    for p, param in theirs.items():
        if p in ("self", "args", "kwargs") or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if p in ours and isinstance(param.default, (type(None), bool, int, float, str, tuple)):
            assert ours[p].default == param.default, (
                f"{name}({p}=...) default {ours[p].default!r} != {param.default!r}"
            )


def test_lambda_callback_takes_every_hook_lightnings_takes():
    pl_callbacks = pytest.importorskip("pytorch_lightning.callbacks", reason="Lightning is the oracle here")
    hooks = [p for p in inspect.signature(pl_callbacks.LambdaCallback.__init__).parameters if p != "self"]
    callbacks.LambdaCallback(**dict.fromkeys(hooks, lambda *a: None))  # an unknown name raises TypeError
