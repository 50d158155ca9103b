"""``trainer.state`` read as Lightning 2.6 reads it: ``.fn`` is the entry point (fit, validate, test, predict) and
``.stage`` what the loop is doing now (train, sanity_check, validate, test, predict), recorded in hooks of the same
task run under Lightning and Tandem."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from trainer import Task, Trainer

pl = pytest.importorskip("pytorch_lightning")
QUIET = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
HOOKS = ("on_fit_start", "on_train_epoch_start", "on_train_batch_start", "on_validation_start",
         "on_validation_batch_start", "on_train_end", "on_test_start", "on_test_batch_start", "on_predict_start",
         "on_predict_batch_start", "on_validation_end", "on_fit_end", "on_test_end", "on_predict_end", "teardown")  # fmt: skip


def _record(base):
    class Recorder(base):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(2, 1)
            self.seen: list[tuple[str, str | None, str | None]] = []

        def training_step(self, batch, batch_idx):
            return self.net(batch[0]).sum()

        def validation_step(self, batch, batch_idx):
            return None

        def test_step(self, batch, batch_idx):
            return None

        def predict_step(self, batch, batch_idx):
            return self.net(batch[0])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    def make(name):
        def hook(self, *args, **kwargs):
            state = self.trainer.state
            value = lambda v: None if v is None else str(getattr(v, "value", v))  # noqa: E731
            self.seen.append((name, value(state.fn), value(state.stage)))

        return hook

    for name in HOOKS:
        setattr(Recorder, name, make(name))
    return Recorder


def _run(base, trainer_cls):
    task = _record(base)()
    data = DataLoader(TensorDataset(torch.randn(4, 2)), batch_size=2)
    trainer = trainer_cls(
        max_epochs=1, limit_train_batches=1, limit_val_batches=1, num_sanity_val_steps=1, **QUIET
    )
    trainer.fit(task, data, data)
    after_fit = str(trainer.state.fn.value), trainer.state.stage
    trainer.validate(task, data)
    trainer.test(task, data)
    trainer.predict(task, data)
    return task.seen, after_fit, (str(trainer.state.fn.value), trainer.state.stage)


def test_state_fn_and_stage_in_every_hook_are_lightnings():
    ours, theirs = _run(Task, Trainer), _run(pl.LightningModule, pl.Trainer)
    assert ours == theirs
    assert ("on_validation_start", "fit", "sanity_check") in ours[0]  # the sanity check is a stage of its own


def test_stage_can_be_set_as_in_lightning():
    """Lightning's tests set trainer.state.stage before driving a step by hand; it then reads back the same."""
    from trainer.states import RunningStage

    trainer = Trainer(max_steps=1, **QUIET)
    theirs = pl.Trainer(max_steps=1, accelerator="cpu", **QUIET)
    for stage in (RunningStage.TRAINING, RunningStage.SANITY_CHECKING, RunningStage.TESTING):
        trainer.state.stage = stage
        theirs.state.stage = pl.trainer.states.RunningStage(stage.value)
        assert trainer.sanity_checking == theirs.sanity_checking
        assert (trainer.training, trainer.testing) == (theirs.training, theirs.testing)
