"""Every hook Lightning 2.x calls on a LightningModule or a Callback is either called by Tandem or refused when
the run starts with a TaskError that names it: never silently ignored. Hooks Lightning 2.0 removed (the 1.x
`*_epoch_end(outputs)` family) are refused at fit start, as Lightning itself refuses them."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from callbacks import Callback
from tandem_core.errors import TaskError
from tests.ports.harness import QUIET
from trainer import Task, Trainer

_NONE: Callable[..., Any] = lambda self, *args, **kwargs: None  # noqa: E731

#: the hooks a Lightning 2.x Trainer calls on a LightningModule, with an override that does the default work
TASK_HOOKS: dict[str, Callable[..., Any]] = {
    **dict.fromkeys(
        "on_fit_start on_fit_end on_train_start on_train_end on_validation_start on_validation_end on_test_start "
        "on_test_end on_predict_start on_predict_end on_train_batch_start on_train_batch_end "
        "on_validation_batch_start on_validation_batch_end on_test_batch_start on_test_batch_end "
        "on_predict_batch_start on_predict_batch_end on_train_epoch_start on_train_epoch_end "
        "on_validation_epoch_start on_validation_epoch_end on_test_epoch_start on_test_epoch_end "
        "on_predict_epoch_start on_predict_epoch_end on_before_zero_grad on_before_backward on_after_backward "
        "on_before_optimizer_step configure_model prepare_data setup teardown "
        "on_save_checkpoint on_load_checkpoint configure_gradient_clipping".split(),
        _NONE,
    ),
    "on_validation_model_zero_grad": lambda self: self.zero_grad(),
    "on_validation_model_eval": lambda self: self.eval(),
    "on_validation_model_train": lambda self: self.train(),
    "on_test_model_eval": lambda self: self.eval(),
    "on_test_model_train": lambda self: self.train(),
    "on_predict_model_eval": lambda self: self.eval(),
    "on_before_batch_transfer": lambda self, batch, dataloader_idx: batch,
    "transfer_batch_to_device": lambda self, batch, device, dataloader_idx: [t.to(device) for t in batch],
    "on_after_batch_transfer": lambda self, batch, dataloader_idx: batch,
    "configure_callbacks": lambda self: [],
    "backward": lambda self, loss, *args, **kwargs: loss.backward(),
    "optimizer_step": lambda self, epoch, batch_idx, optimizer, closure: optimizer.step(closure=closure),
    "optimizer_zero_grad": lambda self, epoch, batch_idx, optimizer: optimizer.zero_grad(),
    "lr_scheduler_step": lambda self, scheduler, metric: scheduler.step(),
}
#: the hooks a Lightning 2.x Trainer calls on a Callback (after trainer and module)
CALLBACK_HOOKS = (
    "setup teardown on_fit_start on_fit_end on_sanity_check_start on_sanity_check_end on_train_batch_start "
    "on_train_batch_end on_train_epoch_start on_train_epoch_end on_validation_epoch_start on_validation_epoch_end "
    "on_test_epoch_start on_test_epoch_end on_predict_epoch_start on_predict_epoch_end on_validation_batch_start "
    "on_validation_batch_end on_test_batch_start on_test_batch_end on_predict_batch_start on_predict_batch_end "
    "on_train_start on_train_end on_validation_start on_validation_end on_test_start on_test_end on_predict_start "
    "on_predict_end on_exception state_dict load_state_dict on_save_checkpoint on_load_checkpoint "
    "on_before_backward on_after_backward on_before_optimizer_step on_before_zero_grad"
).split()


def _loader() -> DataLoader:
    g = torch.Generator().manual_seed(0)
    return DataLoader(
        TensorDataset(torch.randn(16, 4, generator=g), torch.randint(0, 2, (16,), generator=g)), batch_size=8
    )


class Base(Task):
    """A tiny task with every step, its own loaders and a scheduler, so that every hook has a reason to run."""

    def __init__(self, fail: bool = False) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 2)
        self.called: set[str] = set()
        self.steps = 0
        self.fail = fail

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.steps += 1
        if self.fail:
            raise RuntimeError("deliberate failure")
        return F.cross_entropy(self(batch[0]), batch[1])

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", F.cross_entropy(self(batch[0]), batch[1]))

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self.log("test_loss", F.cross_entropy(self(batch[0]), batch[1]))

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> torch.Tensor:
        return self(batch[0])

    def configure_optimizers(self) -> Any:
        opt = torch.optim.SGD(self.parameters(), lr=0.1)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, step_size=1)}

    def train_dataloader(self) -> DataLoader:
        return _loader()

    def val_dataloader(self) -> DataLoader:
        return _loader()

    def test_dataloader(self) -> DataLoader:
        return _loader()

    def predict_dataloader(self) -> DataLoader:
        return _loader()


def _recording(name: str, behaviour: Callable[..., Any]) -> Callable[..., Any]:
    def hook(self: Any, *args: Any, **kwargs: Any) -> Any:
        self.called.add(name)
        return behaviour(self, *args, **kwargs)

    hook.__name__ = name
    return hook


class RecordingCallback(Callback):
    def __init__(self) -> None:
        self.called: set[str] = set()


def _classes(task_hooks: list[str], callback_hooks: list[str]) -> tuple[type, type]:
    task_cls = type("AllHooks", (Base,), {n: _recording(n, TASK_HOOKS[n]) for n in task_hooks})
    cb_methods = {
        n: _recording(n, _NONE) for n in callback_hooks if n not in ("state_dict", "load_state_dict")
    }
    cb_methods["state_dict"] = _recording("state_dict", lambda self: {"seen": True})
    cb_methods["load_state_dict"] = _recording("load_state_dict", _NONE)
    return task_cls, type("AllCallbackHooks", (RecordingCallback,), cb_methods)


def _scenario(task_cls: type, cb_cls: type, root: str) -> tuple[set[str], set[str]]:
    """fit (checkpointing), validate, test, predict; a resumed fit; a fit that fails. Returns the hooks called."""
    task, cb = task_cls(), cb_cls()
    trainer = Trainer(
        max_epochs=1, accelerator="cpu", logger=False, default_root_dir=root, callbacks=[cb], **QUIET
    )
    trainer.fit(task)
    trainer.validate(task)
    trainer.test(task)
    trainer.predict(task)
    resumed, cb2 = task_cls(), cb_cls()
    Trainer(
        max_epochs=2, accelerator="cpu", logger=False, default_root_dir=root, callbacks=[cb2], **QUIET
    ).fit(
        resumed,
        ckpt_path=trainer.checkpoint_callback.last_model_path or trainer.checkpoint_callback.best_model_path,
    )
    failing, cb3 = task_cls(fail=True), cb_cls()
    with pytest.raises(RuntimeError, match="deliberate failure"):
        Trainer(
            max_epochs=1,
            accelerator="cpu",
            logger=False,
            enable_checkpointing=False,
            callbacks=[cb3],
            **QUIET,
        ).fit(failing)
    return task.called | resumed.called | failing.called, cb.called | cb2.called | cb3.called


def test_every_lightning_hook_is_called_or_refused_at_the_start(tmp_path):
    task_hooks, callback_hooks = list(TASK_HOOKS), list(CALLBACK_HOOKS)
    refused: list[str] = []
    for _ in range(len(task_hooks) + len(callback_hooks) + 1):
        task_cls, cb_cls = _classes(task_hooks, callback_hooks)
        probe = task_cls()
        try:
            Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False, **QUIET).fit(
                probe
            )
            break
        except TaskError as e:  # refused: it must name one of the overridden hooks, before any training step
            found = {
                m.start(): n for n in task_hooks + callback_hooks if (m := re.search(rf"\b{n}\b", str(e)))
            }
            assert found, f"the TaskError names no hook: {e}"
            named = [found[min(found)]]  # the first hook the message names is the one refused
            assert probe.steps == 0, f"{named[0]} was refused only after training had started"
            refused.append(named[0])
            task_hooks = [n for n in task_hooks if n != named[0]]
            callback_hooks = [n for n in callback_hooks if n != named[0]]
    task_called, cb_called = _scenario(*_classes(task_hooks, callback_hooks), str(tmp_path))
    assert sorted(set(task_hooks) - task_called) == [], f"task hooks silently ignored (refused: {refused})"
    assert sorted(set(callback_hooks) - cb_called) == [], (
        f"callback hooks silently ignored (refused: {refused})"
    )


def test_the_deprecated_configure_sharded_model_is_called_or_refused():
    # Lightning still calls it (with a deprecation warning) but refuses it next to configure_model
    task = type(
        "Sharded", (Base,), {"configure_sharded_model": _recording("configure_sharded_model", _NONE)}
    )()
    try:
        Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False, **QUIET).fit(task)
    except TaskError as e:
        assert "configure_sharded_model" in str(e) and task.steps == 0
    else:
        assert "configure_sharded_model" in task.called


@pytest.mark.parametrize("name", ["training_epoch_end", "validation_epoch_end"])
def test_hooks_lightning_removed_are_refused_at_fit_start(name):
    task = type("OldStyle", (Base,), {name: lambda self, outputs: None})()
    with pytest.raises(TaskError, match=name):
        Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False, **QUIET).fit(task)
    assert task.steps == 0


def test_test_epoch_end_is_refused_when_testing_starts():
    task = type("OldStyle", (Base,), {"test_epoch_end": lambda self, outputs: None})()
    with pytest.raises(TaskError, match="test_epoch_end"):
        Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, **QUIET).test(task)
