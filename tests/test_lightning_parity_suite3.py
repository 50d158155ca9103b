"""Public behaviour that Lightning's own tests (issue 43, third round: accelerators/, callbacks/, checkpointing/,
core/, loggers/, loops/, models/) found different or deliberate, each run as the same script under Lightning and
Tandem and compared."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from conftest import QUIET

import callbacks as tandem_callbacks
from trainer import Trainer
from trainer.demos import BoringModel

pl = pytest.importorskip("pytorch_lightning")
from pytorch_lightning.demos.boring_classes import BoringModel as PLBoringModel  # noqa: E402


def _resume_order(lightning: bool, tmp_path: Any) -> list[str]:
    """The moments a resume restores the task and a callback, among the setup hooks and configure_optimizers."""
    seen: list[str] = []
    base_cb = pl.Callback if lightning else tandem_callbacks.Callback

    class Recorder(base_cb):  # type: ignore[misc,valid-type]
        def state_dict(self) -> dict[str, Any]:
            return {"n": 1}

        def load_state_dict(self, state_dict: dict[str, Any]) -> None:
            seen.append("callback.load_state_dict")

        def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
            seen.append("callback.setup")

    class Model(PLBoringModel if lightning else BoringModel):  # type: ignore[misc,valid-type]
        def configure_optimizers(self) -> Any:
            seen.append(f"configure_optimizers(restored={bool(self.layer.weight.eq(7.0).all())})")
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
            seen.append("task.on_load_checkpoint")

        def on_fit_start(self) -> None:
            seen.append("on_fit_start")

    trainer_cls = pl.Trainer if lightning else Trainer
    kwargs = dict(QUIET, accelerator="cpu", max_epochs=1, limit_train_batches=1, limit_val_batches=0)
    root = tmp_path / ("pl" if lightning else "tandem")
    first = trainer_cls(default_root_dir=root, callbacks=[Recorder()], **kwargs)
    model = Model()
    first.fit(model)
    with torch.no_grad():
        model.layer.weight.fill_(7.0)  # the weights the file will hold
    path = str(root / "saved.ckpt")
    first.save_checkpoint(path)
    seen.clear()
    kwargs["max_epochs"] = 2
    trainer_cls(default_root_dir=root, callbacks=[Recorder()], **kwargs).fit(Model(), ckpt_path=path)
    return seen


def test_a_resume_restores_weights_and_callbacks_before_configure_optimizers_as_lightning(tmp_path):
    """Lightning's single-device order (its `restore_checkpoint_after_setup` False): the task's weights and the
    callbacks' states are restored after `setup` and before `configure_optimizers`, which sees the restored
    weights. Tandem restores there on every strategy (after the strategy placed, wrapped or sharded the module)
    and has no such flag: accelerators/test_cpu.py::test_restore_checkpoint_after_pre_setup_default."""
    ours, theirs = _resume_order(False, tmp_path), _resume_order(True, tmp_path)
    assert ours == theirs
    assert theirs.index("task.on_load_checkpoint") < theirs.index("configure_optimizers(restored=True)")


def _timed_saves(lightning: bool, tmp_path: Any) -> tuple[int, int]:
    """ModelCheckpoint(train_time_interval=...) under a scripted clock (7 s a batch, a save a minute at most):
    the files written and the clock reads, with as many clock values as Lightning reads."""
    from datetime import timedelta
    from unittest import mock

    batches, epochs = 16, 2
    module = "pytorch_lightning.callbacks.model_checkpoint" if lightning else "callbacks.checkpoint_schedule"
    ckpt_cls = pl.callbacks.ModelCheckpoint if lightning else tandem_callbacks.ModelCheckpoint
    trainer_cls = pl.Trainer if lightning else Trainer
    out = tmp_path / ("pl" if lightning else "tandem")
    with mock.patch(f"{module}.time") as clock:
        clock.monotonic.side_effect = [
            7.0 * i for i in range(batches * epochs + 1)
        ]  # StopIteration past them
        ckpt = ckpt_cls(dirpath=out, filename="{epoch}-{step}", train_time_interval=timedelta(seconds=30),
                        save_top_k=-1, save_last=False)  # fmt: skip
        kwargs = dict(QUIET, enable_checkpointing=True, accelerator="cpu", max_epochs=epochs)
        kwargs.update(limit_train_batches=batches, limit_val_batches=0, default_root_dir=out)
        trainer_cls(callbacks=[ckpt], **kwargs).fit(PLBoringModel() if lightning else BoringModel())
        return len(list(out.iterdir())), clock.monotonic.call_count


def test_a_time_interval_checkpoint_reads_the_clock_when_lightning_does(tmp_path):
    """The clock is read when training starts and at each training batch's end, not when the callback is built
    (checkpointing/test_model_checkpoint.py::test_model_checkpoint_train_time_interval gives exactly that many
    values): the same saves, the same reads."""
    ours, theirs = _timed_saves(False, tmp_path), _timed_saves(True, tmp_path)
    assert ours == theirs and theirs[0] > 1


def test_stage_and_epoch_hooks_of_callbacks_take_lightnings_pl_module_keyword():
    """`timer.on_train_start(trainer=..., pl_module=...)` (callbacks/test_timer.py::test_timer_time_remaining),
    and a user's callback whose hooks are written with Tandem's `task` called with Lightning's keyword."""
    from unittest.mock import Mock

    seen = {}
    for name, base, timer_cls in (
        ("lightning", pl.Callback, pl.callbacks.Timer),
        ("tandem", tandem_callbacks.Callback, tandem_callbacks.Timer),
    ):
        timer = timer_cls(duration="00:00:00:10")
        timer.on_train_start(trainer=Mock(), pl_module=Mock())

        if name == "lightning":

            class Mine(base):  # type: ignore[misc,valid-type]
                def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
                    self.got = pl_module
        else:

            class Mine(base):  # type: ignore[misc,valid-type,no-redef]
                def on_train_epoch_end(self, trainer: Any, task: Any) -> None:  # Tandem's argument name
                    self.got = task

        mine = Mine()
        mine.on_train_epoch_end(trainer=None, pl_module="module")
        seen[name] = (timer.start_time() is not None, mine.got)
    assert seen["tandem"] == seen["lightning"] == (True, "module")
