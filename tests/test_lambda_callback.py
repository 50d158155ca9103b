"""LambdaCallback: each function runs as its hook, with the hook's arguments."""

from __future__ import annotations

import pytest
from callback_tasks import Scored, loader
from conftest import FAST

from callbacks import LambdaCallback
from callbacks.lambda_fn import HOOKS
from trainer import Trainer


def test_functions_run_as_hooks_with_their_arguments():
    calls = []
    cb = LambdaCallback(
        setup=lambda trainer, task, stage: calls.append(("setup", stage)),
        on_train_epoch_end=lambda trainer, task: calls.append(("epoch_end", trainer.current_epoch)),
        on_train_batch_end=lambda trainer, task, outputs, batch, batch_idx: calls.append(
            ("batch", batch_idx)
        ),
    )
    Trainer(max_epochs=2, callbacks=[cb], **FAST).fit(Scored(), loader())
    assert calls == [
        ("setup", "fit"),
        ("batch", 0),
        ("batch", 1),
        ("epoch_end", 0),
        ("batch", 0),
        ("batch", 1),
        ("epoch_end", 1),
    ]
    assert callable(cb.setup) and isinstance(cb, LambdaCallback)


def test_lightnings_hook_list_and_unknown_names():
    assert len(HOOKS) == 37 and "on_predict_epoch_end" in HOOKS
    with pytest.raises(TypeError, match="on_epoch_start"):
        LambdaCallback(on_epoch_start=print)
