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
