"""Record every hook call of a task, a callback and a DataModule in one framework-neutral form.

The same file runs under Tandem and, converted by tests/ports/lightning_check.py, under Lightning: the
classes below override every hook (so both frameworks call them all) and append ``name arg arg ...`` after
each call returns, as Lightning's own tests/tests_pytorch/models/test_hooks.py records them. Arguments are
written by kind (``trainer``, ``task``, ``batch``, ``opt``, ``fn``, ``ckpt``, ...) and plain values as they are.
The expected sequences live in tests/ports/hook_order/<scenario>.txt, one call per line; they were recorded
from Lightning 2.6.6 (``TANDEM_RECORD_HOOKS=1 python -m tests.ports.lightning_check -k hook_order``) and
checked against the lists of Lightning's test_hooks.py.
"""

from __future__ import annotations

import inspect
import os
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from callbacks import Callback
from trainer import DataModule, Task

GOLDEN_DIR = os.environ.get("TANDEM_HOOK_GOLDENS") or os.path.join(os.path.dirname(__file__), "hook_order")

#: what the task records: Lightning's hooks and overridable methods (HookedModel's list in test_hooks.py)
TASK_NAMES = (
    "prepare_data setup teardown configure_model configure_optimizers configure_callbacks "
    "train_dataloader val_dataloader test_dataloader predict_dataloader "
    "on_fit_start on_fit_end on_train_start on_train_end on_train_epoch_start on_train_epoch_end "
    "on_train_batch_start on_train_batch_end on_validation_start on_validation_end on_validation_epoch_start "
    "on_validation_epoch_end on_validation_batch_start on_validation_batch_end on_test_start on_test_end "
    "on_test_epoch_start on_test_epoch_end on_test_batch_start on_test_batch_end on_predict_start "
    "on_predict_end on_predict_epoch_start on_predict_epoch_end on_predict_batch_start on_predict_batch_end "
    "on_before_backward backward on_after_backward on_before_optimizer_step clip_gradients "
    "configure_gradient_clipping optimizer_step optimizer_zero_grad on_before_zero_grad lr_scheduler_step "
    "on_before_batch_transfer transfer_batch_to_device on_after_batch_transfer on_save_checkpoint "
    "on_load_checkpoint on_validation_model_eval on_validation_model_train on_validation_model_zero_grad "
    "on_test_model_eval on_test_model_train on_predict_model_eval manual_backward training_step "
    "validation_step test_step predict_step forward train zero_grad"
).split()
#: what the callback records (HookedCallback's list)
CALLBACK_NAMES = (
    "setup teardown on_fit_start on_fit_end on_sanity_check_start on_sanity_check_end on_train_start "
    "on_train_end on_train_epoch_start on_train_epoch_end on_train_batch_start on_train_batch_end "
    "on_validation_start on_validation_end on_validation_epoch_start on_validation_epoch_end "
    "on_validation_batch_start on_validation_batch_end on_test_start on_test_end on_test_epoch_start "
    "on_test_epoch_end on_test_batch_start on_test_batch_end on_predict_start on_predict_end "
    "on_predict_epoch_start on_predict_epoch_end on_predict_batch_start on_predict_batch_end "
    "on_before_backward on_after_backward on_before_optimizer_step on_before_zero_grad on_save_checkpoint "
    "on_load_checkpoint on_exception state_dict load_state_dict"
).split()
#: what the DataModule records (HookedDataModule's list)
DM_NAMES = (
    "prepare_data setup teardown train_dataloader val_dataloader test_dataloader predict_dataloader "
    "state_dict load_state_dict on_before_batch_transfer transfer_batch_to_device on_after_batch_transfer"
).split()


def kind(x: Any, task: Any = None) -> str:
    """One token for an argument: its kind for objects, its value for plain data."""
    name = type(x).__name__
    if x is task and task is not None:
        return "task"
    if name == "Trainer":
        return "trainer"
    if isinstance(x, Task):
        return "task"
    if isinstance(x, torch.Tensor):
        return "T"
    if isinstance(x, torch.optim.Optimizer) or name in ("LightningOptimizer", "TaskOptimizer"):
        return "opt"
    if isinstance(x, torch.device):
        return "device"
    if isinstance(x, torch.optim.lr_scheduler.LRScheduler):
        return "sched"
    if isinstance(x, BaseException):
        return f"exc:{name}"
    if isinstance(x, dict):
        if "state_dict" in x and "optimizer_states" in x:
            return "ckpt"
        return "{" + ",".join(f"{k}:{kind(v, task)}" for k, v in sorted(x.items())) + "}"
    if isinstance(x, (list, tuple)):
        if any(isinstance(v, torch.Tensor) for v in x):
            return "batch"
        return "[" + ",".join(kind(v, task) for v in x) + "]"
    if callable(x):
        return "fn"
    if isinstance(x, str):
        return str.__str__(x)  # a str enum (Lightning's TrainerFn) as its value
    if x is None or isinstance(x, (bool, int, float)):
        return str(x)
    return name


def _recorder(prefix: str, name: str, log: list[str]) -> Any:
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        parent = getattr(super(owner[0], self), name)
        out = parent(*args, **kwargs)
        log.append(
            " ".join(
                [
                    prefix + name,
                    *(kind(v, getattr(self, "_rec_task", self)) for v in _bound(parent, args, kwargs)),
                ]
            )
        )
        return out

    owner: list[type] = []
    method.__name__ = name
    return method, owner


def _bound(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    """The call's arguments in the signature's order with defaults filled in, so that f(x, 1) and f(x, k=1)
    (and a default passed explicitly) record the same."""
    try:
        bound = inspect.signature(fn).bind(*args, **kwargs)
    except (TypeError, ValueError):
        return [*args, *(kwargs[k] for k in sorted(kwargs))]
    bound.apply_defaults()
    values: list[Any] = []
    for param, value in zip(bound.signature.parameters.values(), bound.arguments.values()):
        if param.kind is inspect.Parameter.VAR_POSITIONAL:
            values.extend(value)
        elif param.kind is inspect.Parameter.VAR_KEYWORD:
            values.extend(value[k] for k in sorted(value))
        else:
            values.append(value)
    return values


def recording(base: type, names: list[str], log: list[str], prefix: str = "", **extra: Any) -> type:
    """A subclass of `base` whose methods `names` run the base's and then append a line to `log`."""
    methods, owners = {}, []
    for name in names:
        if hasattr(base, name):
            fn, owner = _recorder(prefix, name, log)
            methods[name], owners = fn, [*owners, owner]
    cls = type(f"Recording{base.__name__}", (base,), {**methods, **extra})
    for owner in owners:
        owner.append(cls)
    return cls


class RandomDataset(Dataset):
    """Lightning's BoringModel data: 64 random vectors of 32."""

    def __init__(self, size: int = 32, length: int = 64) -> None:
        self.data = torch.randn(length, size, generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.data[i]


class Boring(Task):
    """Lightning's BoringModel: Linear(32, 2), loss = mean of the outputs, SGD 0.1 with StepLR(1)."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(32, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)

    def loss(self, out: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.mse_loss(out, torch.ones_like(out))

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        return {"loss": self.loss(self(batch))}

    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        return {"x": self.loss(self(batch))}

    def test_step(self, batch: Any, batch_idx: int) -> Any:
        return {"y": self.loss(self(batch))}

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Any:
        return self(batch)

    def configure_optimizers(self) -> Any:
        opt = torch.optim.SGD(self.layer.parameters(), lr=0.1)
        return [opt], [torch.optim.lr_scheduler.StepLR(opt, step_size=1)]

    def train_dataloader(self) -> DataLoader:
        return DataLoader(RandomDataset())

    def val_dataloader(self) -> DataLoader:
        return DataLoader(RandomDataset())

    def test_dataloader(self) -> DataLoader:
        return DataLoader(RandomDataset())

    def predict_dataloader(self) -> DataLoader:
        return DataLoader(RandomDataset())

    # overridden so that they are called (as in test_hooks.py's HookedModel)
    def configure_model(self) -> None: ...

    def prepare_data(self) -> None: ...

    def on_validation_model_train(self) -> None: ...

    def on_test_model_train(self) -> None: ...


class BoringDataModule(DataModule):
    """Lightning's BoringDataModule, reduced: the same random data for every stage."""

    def prepare_data(self) -> None: ...

    def setup(self, stage: str) -> None: ...

    def train_dataloader(self) -> DataLoader:
        return DataLoader(RandomDataset())

    def val_dataloader(self) -> DataLoader:
        return DataLoader(RandomDataset())

    def test_dataloader(self) -> DataLoader:
        return DataLoader(RandomDataset())

    def predict_dataloader(self) -> DataLoader:
        return DataLoader(RandomDataset())


class StatefulCallback(Callback):
    """A callback with state, as HookedCallback (its state_dict is {"foo": True})."""

    def state_dict(self) -> dict[str, Any]:
        return {"foo": True}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...


def hooked(log: list[str], base: type = Boring, **extra: Any) -> tuple[type, Callback]:
    """The recording task class and a recording callback instance, both appending to `log`."""
    task_cls = recording(base, TASK_NAMES, log, **extra)
    cb_cls = recording(StatefulCallback, CALLBACK_NAMES, log, prefix="Callback.")
    return task_cls, cb_cls()


def golden(scenario: str) -> list[str]:
    with open(os.path.join(GOLDEN_DIR, f"{scenario}.txt")) as f:
        return [line.rstrip("\n") for line in f if line.strip() and not line.startswith("#")]


def check(scenario: str, log: list[str]) -> None:
    """Compare `log` with the scenario's recorded Lightning sequence (or record it, under TANDEM_RECORD_HOOKS)."""
    if os.environ.get("TANDEM_RECORD_HOOKS"):
        os.makedirs(GOLDEN_DIR, exist_ok=True)
        with open(os.path.join(GOLDEN_DIR, f"{scenario}.txt"), "w") as f:
            f.write(f"# {scenario}: hook calls recorded from PyTorch Lightning by tests/ports/hookrec.py\n")
            f.writelines(line + "\n" for line in log)
        return
    expected = golden(scenario)
    if log != expected:
        import difflib

        diff = "\n".join(difflib.unified_diff(expected, log, "lightning", "tandem", lineterm="", n=2))
        raise AssertionError(f"hook sequence of {scenario!r} differs from Lightning's:\n{diff}")
