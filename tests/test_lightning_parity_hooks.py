"""Hook calls compared with Lightning itself (pytorch_lightning, the reference extra): the same task, recorded
the way Lightning's own tests/tests_pytorch/models/test_hooks.py records them (each hook wrapped on the
instance), run under both trainers; and `is_overridden` against Lightning's on the same classes."""

from __future__ import annotations

import functools
from typing import Any
from unittest import mock

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

pl = pytest.importorskip("pytorch_lightning")

from callbacks import Callback  # noqa: E402
from trainer import DataModule, Task, Trainer  # noqa: E402
from trainer.utilities import is_overridden  # noqa: E402

TASK_HOOKS = (
    "configure_callbacks", "prepare_data", "setup", "configure_model", "configure_optimizers", "on_fit_start",
    "zero_grad", "train", "val_dataloader", "train_dataloader", "on_validation_model_eval",
    "on_validation_model_train", "on_validation_model_zero_grad", "on_validation_start", "on_validation_end",
    "on_validation_epoch_start", "on_validation_epoch_end", "on_validation_batch_start", "on_validation_batch_end",
    "validation_step", "on_train_start", "on_train_end", "on_train_epoch_start", "on_train_epoch_end",
    "on_train_batch_start", "on_train_batch_end", "training_step", "on_before_zero_grad", "optimizer_zero_grad",
    "on_before_backward", "backward", "on_after_backward", "on_before_optimizer_step",
    "configure_gradient_clipping", "clip_gradients", "optimizer_step", "lr_scheduler_step", "on_fit_end",
    "teardown", "on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer",
)  # fmt: skip
CALLBACK_HOOKS = (
    "setup", "teardown", "on_fit_start", "on_fit_end", "on_sanity_check_start", "on_sanity_check_end",
    "on_train_start", "on_train_end", "on_train_epoch_start", "on_train_epoch_end", "on_train_batch_start",
    "on_train_batch_end", "on_validation_start", "on_validation_end", "on_validation_epoch_start",
    "on_validation_epoch_end", "on_validation_batch_start", "on_validation_batch_end", "on_before_zero_grad",
    "on_before_backward", "on_after_backward", "on_before_optimizer_step",
)  # fmt: skip


def _plain(v: Any) -> Any:
    return v if isinstance(v, (int, float, str, bool, type(None))) else type(v).__name__


def _wrap(obj: Any, names: tuple[str, ...], called: list[tuple[Any, ...]], prefix: str = "") -> None:
    """As Lightning's test does: each hook replaced on the instance by a partial that records its call."""

    def call(hook: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        out = fn(*args, **kwargs)
        skip = 2 if prefix else 0  # a callback's (trainer, task)
        called.append(
            (prefix + hook, len(args) - skip, tuple(sorted((k, _plain(v)) for k, v in kwargs.items())))
        )
        return out

    for name in names:
        attr = getattr(obj, name)
        wrapped = functools.partial(call, name, attr)
        functools.update_wrapper(wrapped, attr)
        setattr(obj, name, wrapped)


def _loader() -> DataLoader:
    g = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(12, 4, generator=g)), batch_size=4)


def _task_class(base: type) -> type:
    class Recorded(base):  # type: ignore[misc,valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.layer(x)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return self(batch[0]).pow(2).mean()

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            self(batch[0])

        def configure_optimizers(self) -> Any:
            opt = torch.optim.SGD(self.parameters(), lr=0.1)
            return [opt], [torch.optim.lr_scheduler.StepLR(opt, 1)]

        def train_dataloader(self) -> DataLoader:
            return _loader()

        def val_dataloader(self) -> DataLoader:
            return _loader()

        # overridden so that they are called (as in Lightning's test)
        def prepare_data(self) -> None: ...

        def configure_model(self) -> None: ...

        def on_validation_model_train(self) -> None:
            self.train()

    return Recorded


def _fit(lightning: bool, tmp_path: Any, **trainer_kwargs: Any) -> list[tuple[Any, ...]]:
    called: list[tuple[Any, ...]] = []
    task = _task_class(pl.LightningModule if lightning else Task)()
    _wrap(task, TASK_HOOKS, called)
    cb = (pl.Callback if lightning else Callback)()
    _wrap(cb, CALLBACK_HOOKS, called, "Callback.")
    trainer_cls = pl.Trainer if lightning else Trainer
    kwargs = dict(
        default_root_dir=tmp_path / ("pl" if lightning else "tandem"), max_epochs=1, limit_val_batches=1
    )
    kwargs.update(
        enable_progress_bar=False, enable_model_summary=False, logger=False, enable_checkpointing=False
    )
    trainer_cls(callbacks=[cb], **kwargs, **trainer_kwargs).fit(task)
    return called


@pytest.mark.parametrize(
    "kwargs",
    [
        {"limit_train_batches": 2},
        # an epoch of 3 batches with windows of 2: the short last window closes at the epoch's end, and the
        # validation after it releases the gradients (zero_grad, on_validation_model_zero_grad) as Lightning's
        {"limit_train_batches": 3, "accumulate_grad_batches": 2, "num_sanity_val_steps": 0},
        {"limit_train_batches": 2, "gradient_clip_val": 0.5, "num_sanity_val_steps": 0},
    ],
)
def test_recorded_fit_hooks_equal_lightnings(tmp_path: Any, kwargs: dict[str, Any]) -> None:
    ours, theirs = _fit(False, tmp_path, **kwargs), _fit(True, tmp_path, **kwargs)
    assert ours == theirs


def test_short_last_window_releases_gradients_before_validation(tmp_path: Any) -> None:
    called = _fit(False, tmp_path, limit_train_batches=3, accumulate_grad_batches=2, num_sanity_val_steps=0)
    names = [c[0] for c in called]
    last_step = len(names) - 1 - names[::-1].index("optimizer_step")
    assert names[last_step:].index("on_validation_model_zero_grad") < names[last_step:].index(
        "on_validation_start"
    )


def test_setup_and_teardown_get_the_stage_by_keyword(tmp_path: Any) -> None:
    called = _fit(False, tmp_path, limit_train_batches=1, num_sanity_val_steps=0)
    for name in ("setup", "teardown", "Callback.setup", "Callback.teardown"):
        assert (name, 0, (("stage", "fit"),)) in called


def test_a_hook_set_to_none_on_the_instance_is_not_called(tmp_path: Any) -> None:
    seen: list[str] = []
    task = _task_class(Task)()
    task.on_train_start = lambda: seen.append("instance")  # a callable on the instance is called
    task.validation_step = None  # None: no validation (Lightning: not overridden)
    Trainer(
        default_root_dir=tmp_path,
        max_epochs=1,
        limit_train_batches=1,
        logger=False,
        enable_progress_bar=False,
    ).fit(task)
    assert seen == ["instance"]
    assert not is_overridden("validation_step", task)


def _dm_class(base: type) -> type:
    class DM(base):  # type: ignore[misc,valid-type]
        def prepare_data(self) -> None: ...

        def train_dataloader(self) -> DataLoader:
            return _loader()

        def val_dataloader(self) -> DataLoader:
            return _loader()

    return DM


DM_HOOKS = ("prepare_data", "setup", "teardown", "train_dataloader", "val_dataloader", "state_dict")
DM_HOOKS += ("on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer")


def test_datamodule_hooks_equal_lightnings(tmp_path: Any) -> None:
    runs = []
    for lightning in (False, True):
        called: list[tuple[Any, ...]] = []
        dm = _dm_class(pl.LightningDataModule if lightning else DataModule)()
        _wrap(dm, DM_HOOKS, called)
        task = _task_class(pl.LightningModule if lightning else Task)()
        trainer_cls = pl.Trainer if lightning else Trainer
        trainer_cls(
            default_root_dir=tmp_path / str(lightning), max_epochs=1, limit_train_batches=2, limit_val_batches=1,
            logger=False, enable_progress_bar=False, enable_model_summary=False,
        ).fit(task, datamodule=dm)  # fmt: skip
        runs.append(called)
    # the wrapped (default) transfer hooks of the DataModule do not replace the task's: never called
    assert runs[0] == runs[1]
    assert [c[0] for c in runs[0]] == ["prepare_data", "setup", "val_dataloader", "train_dataloader"] + [
        "state_dict",
        "teardown",
    ]


def _lightning_pair() -> tuple[type, type]:
    class L(pl.LightningModule):
        def training_step(self, batch: Any, batch_idx: int) -> None: ...

    class T(Task):
        def training_step(self, batch: Any, batch_idx: int) -> None: ...

    return L, T


@pytest.mark.parametrize(
    "name", ["training_step", "validation_step", "on_fit_start", "configure_model", "backward", "nothing"]
)
def test_is_overridden_equals_lightnings(name: str) -> None:
    from pytorch_lightning.utilities.model_helpers import is_overridden as pl_is_overridden

    L, T = _lightning_pair()
    assert is_overridden(name, T()) == pl_is_overridden(name, L())
    assert is_overridden(name, None) is pl_is_overridden(name, None) is False
    # wrapped on the instance (functools.wraps over the default): still the default
    lt, tt = L(), T()
    for obj in (lt, tt):
        if hasattr(obj, name):
            attr = getattr(obj, name)
            setattr(obj, name, functools.update_wrapper(functools.partial(attr), attr))
    assert is_overridden(name, tt) == pl_is_overridden(name, lt)


def test_is_overridden_mock_none_and_parents() -> None:
    from pytorch_lightning.utilities.model_helpers import is_overridden as pl_is_overridden

    L, T = _lightning_pair()
    lt, tt = L(), T()
    lt.training_step, tt.training_step = None, None
    assert is_overridden("training_step", tt) == pl_is_overridden("training_step", lt) is False
    lt, tt = L(), T()
    lt.on_fit_start = mock.Mock(wraps=lt.on_fit_start)
    tt.on_fit_start = mock.Mock(wraps=tt.on_fit_start)
    assert is_overridden("on_fit_start", tt) == pl_is_overridden("on_fit_start", lt) is False

    class Cb(Callback):
        def on_fit_start(self, trainer: Any, task: Any) -> None: ...

    class PlCb(pl.Callback):
        def on_fit_start(self, trainer: Any, pl_module: Any) -> None: ...

    assert is_overridden("on_fit_start", Cb()) == pl_is_overridden("on_fit_start", PlCb()) is True
    assert is_overridden("on_fit_end", Cb()) == pl_is_overridden("on_fit_end", PlCb()) is False
    assert is_overridden("training_step", T(), parent=Task) is True
    with pytest.raises(ValueError):
        is_overridden("training_step", object())
    with pytest.raises(ValueError):
        pl_is_overridden("training_step", object())

    class Extra(T):
        def extra(self) -> None: ...

    class PlExtra(L):
        def extra(self) -> None: ...

    with pytest.raises(ValueError):  # the parent lacks the method: an error in both
        is_overridden("extra", Extra())
    with pytest.raises(ValueError):
        pl_is_overridden("extra", PlExtra())


def test_deliberate_differences(tmp_path: Any) -> None:
    """docs/porting.md, "Deliberate differences found by Lightning's tests": Tandem's own checkpoint keys next to
    Lightning's shared ones, the DataModule's state under "datamodule", the optimizer wrapper's name."""
    from trainer.demos import BoringDataModule, BoringModel

    seen: dict[str, Any] = {}

    class Saving(BoringModel):
        def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
            seen.update(checkpoint)

    class Stateful(BoringDataModule):
        def state_dict(self) -> dict[str, Any]:
            return {"my": "state"}

    trainer = Trainer(
        default_root_dir=tmp_path, max_steps=1, limit_val_batches=0, logger=False, enable_progress_bar=False
    )
    task = Saving()
    trainer.fit(task, datamodule=Stateful())
    shared = {"state_dict", "optimizer_states", "lr_schedulers", "callbacks", "epoch", "global_step"}
    assert shared <= seen.keys() and "tandem_version" in seen and "pytorch-lightning_version" not in seen
    assert seen["datamodule"] == {"my": "state"} and Stateful.__qualname__ not in seen
    opt = task.optimizers()
    assert str(opt) == "Task" + str(opt.optimizer)


def test_every_callbacks_setup_and_teardown_take_stage_by_keyword() -> None:
    """Lightning calls setup/teardown with ``stage=`` by keyword; so does Tandem, so every built-in callback's own
    setup/teardown must take a parameter named stage."""
    import inspect

    import callbacks

    checked = 0
    for name in dir(callbacks):
        cls = getattr(callbacks, name)
        if not (isinstance(cls, type) and issubclass(cls, Callback)):
            continue
        for hook in ("setup", "teardown"):
            fn = getattr(cls, hook)
            if getattr(fn, "_tandem_default", False):
                continue
            inspect.signature(fn).bind(None, "trainer", "task", stage="fit")
            checked += 1
    assert checked >= 5
