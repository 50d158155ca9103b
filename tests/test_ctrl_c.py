"""Ctrl-C (SIGINT) at a random batch of fit, validate, test and predict, in one process, compared with
Lightning 2.6 on the same script (tests/scripts/ctrl_c.py): the hooks and their arguments are Lightning's up to
the batch that was interrupted, the callbacks' and the DataModule's on_exception receive the KeyboardInterrupt
(as in Lightning), the trainer reads back as interrupted. Tandem's documented differences: it finishes the batch
and stops where every rank can (the next step boundary or evaluation batch), fit saves a checkpoint there (its
step and weights are checked), and the process exits 130 (Lightning saves nothing and exits 1). The same under
ddp x2 and from the terminal's process group: tests/test_ctrl_c_ddp.py (slow)."""

from __future__ import annotations

import os
import random
import signal
import sys
from typing import Any

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts"))
import ctrl_c  # noqa: E402

from trainer.checkpoint import load  # noqa: E402

BATCHES = {
    "fit": 32,
    "validate": 8,
    "test": 8,
    "predict": 8,
}  # 2 epochs of 16 training batches; 8 to evaluate


def _run(framework: str, stage: str, at: int, out: str) -> tuple[Any, list[Any], dict[str, Any], int | None]:
    """One run in this process: (trainer, record, what it saw when it stopped, the SystemExit code or None)."""
    trainer, task, data, record, ended = ctrl_c.build(framework, stage, at, "inside", 1, out)
    code = None
    try:
        getattr(trainer, stage)(task, datamodule=data)
    except SystemExit as e:
        code = e.code
    finally:  # Lightning leaves SIGINT ignored after an interrupt; give this process Python's handler back
        signal.signal(signal.SIGINT, signal.default_int_handler)
    return trainer, record, ended, code


@pytest.mark.parametrize("stage", ["fit", "validate", "test", "predict"])
def test_ctrl_c_at_a_random_batch_reaches_the_hooks_as_in_lightning(tmp_path, stage):
    at = random.randrange(BATCHES[stage])  # counted over the stage (fit: over both epochs)
    where = f"{stage} interrupted at batch {at}"
    pl_trainer, pl_record, _, pl_code = _run("lightning", stage, at, str(tmp_path / "pl"))
    trainer, record, ended, code = _run("tandem", stage, at, str(tmp_path / "tandem"))
    assert pl_code == 1 and code == 130, where  # Lightning exits 1, Tandem 130 (documented)
    assert trainer.interrupted and pl_trainer.interrupted and trainer.state.status == "interrupted", where
    after = ctrl_c.compare(
        pl_record, record, lambda: _run("lightning", stage, -1, str(tmp_path / "pl_full"))[1], stage
    )
    print(f"{where}: Tandem ran {len(after)} hooks after Lightning stopped: {[h[0] for h in after]}")
    if stage == "fit":  # the stop checkpoint: last.ckpt at the step reached, with the weights of that step
        ckpt = load(str(tmp_path / "tandem" / "root" / "checkpoints" / "last.ckpt"))
        assert ckpt["global_step"] == ended["step_at_exception"] == ended["interrupted_at"][1], where
        weights = float(sum(v.double().sum() for v in ckpt["state_dict"].values()))
        assert weights == pytest.approx(ended["weights_at_exception"], rel=1e-12), where


def test_a_second_ctrl_c_stops_at_once_with_the_keyboard_interrupt(tmp_path):
    """The second SIGINT does not wait for a step boundary: KeyboardInterrupt at once (no checkpoint), the
    hooks' on_exception get it, and it reaches the caller (a script's Python then exits by SIGINT)."""
    from callbacks import Callback

    class Twice(Callback):
        def on_train_batch_end(self, trainer, task, outputs, batch, batch_idx):
            if batch_idx == 3:
                os.kill(os.getpid(), signal.SIGINT)
                os.kill(os.getpid(), signal.SIGINT)

    trainer, task, data, record, ended = ctrl_c.build("tandem", "fit", -1, "inside", 1, str(tmp_path))
    trainer.callbacks.append(Twice())
    with pytest.raises(KeyboardInterrupt):
        trainer.fit(task, datamodule=data)
    assert record[-2][0] == "on_exception" and "KeyboardInterrupt" in record[-2][1][0]
    assert not os.path.exists(tmp_path / "root" / "checkpoints" / "last.ckpt")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # Ctrl-C still works afterwards
    assert isinstance(torch.zeros(1), torch.Tensor)
