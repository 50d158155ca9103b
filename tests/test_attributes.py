"""trainer/task/attributes.py: every public name of Lightning's LightningModule (those torch.nn.Module lacks)
exists on Task, or is refused with a TaskError that names it; the new ones behave as Lightning's."""

from __future__ import annotations

import os

import pytest
import torch
from callback_tasks import QUIET
from pytorch_lightning import LightningModule
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from tandem_core.errors import TaskError
from trainer import Task, Trainer

#: names Tandem refuses when used, and a word of the error that says what to use instead
REFUSED = {"to_tensorrt": "torch_tensorrt", "configure_sharded_model": "configure_model"}
#: what calling the default of an unimplemented loader method says
LOADERS = ("train_dataloader", "val_dataloader", "test_dataloader", "predict_dataloader")


class Net(Task):
    def __init__(self, lr: float = 0.1) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Linear(2, 1)
        self.example_input_array = torch.randn(3, 2)

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        return self(batch[0]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


def lightning_names() -> list[str]:
    module = set(dir(nn.Module))
    return sorted(n for n in dir(LightningModule) if not n.startswith("_") and n not in module)


def test_every_lightning_module_name_exists_or_is_refused_by_name():
    assert len(lightning_names()) >= 90  # the real list, not an empty one
    task = Net()
    Trainer(max_steps=1, **QUIET).fit(task, DataLoader(TensorDataset(torch.randn(4, 2)), batch_size=2))
    for name in lightning_names():
        if name in REFUSED:  # refused when read (a property) or called (a method)
            with pytest.raises(TaskError, match=REFUSED[name]):
                getattr(task, name)()
            continue
        value = getattr(task, name)
        if name in LOADERS:
            with pytest.raises(TaskError, match=rf"Net\.{name}\(\) is not implemented"):
                value()
    # the instance attributes Lightning's __init__ sets
    assert task.automatic_optimization is True and task.prepare_data_per_node is True


def test_values_match_lightnings():
    task, lightning = Net(), LightningModule()
    lightning.net = nn.Linear(2, 1)
    for name in ("dtype", "on_gpu", "strict_loading", "fabric", "device_mesh", "automatic_optimization"):
        assert getattr(task, name) == getattr(lightning, name), name
    for name in (
        "CHECKPOINT_HYPER_PARAMS_KEY",
        "CHECKPOINT_HYPER_PARAMS_NAME",
        "CHECKPOINT_HYPER_PARAMS_TYPE",
    ):
        assert getattr(Task, name) == getattr(LightningModule, name)
    task.double()
    assert task.dtype == torch.float64
    assert Net().example_input_array.shape == (3, 2) and LightningModule().example_input_array is None


def test_hparams_initial_and_remove_ignored_hparams():
    task = Net(lr=0.5)
    task.hparams.lr = 1.0
    assert task.hparams_initial == {"lr": 0.5} and task.hparams.lr == 1.0
    task.remove_ignored_hparams(["lr"])
    assert task.hparams == {}


def test_freeze_unfreeze_and_toggled_optimizer():
    task = Net()
    task.freeze()
    assert not task.training and not any(p.requires_grad for p in task.parameters())
    task.unfreeze()
    assert task.training and all(p.requires_grad for p in task.parameters())

    class Two(Net):
        def __init__(self):
            super().__init__()
            self.other = nn.Linear(1, 1)

        def configure_optimizers(self):
            return [
                torch.optim.SGD(self.net.parameters(), lr=0.1),
                torch.optim.SGD(self.other.parameters(), lr=0.1),
            ]

    task = Two()
    task.automatic_optimization = False
    seen = []

    def step(batch, batch_idx):
        first, _ = task.optimizers()
        with task.toggled_optimizer(first):
            seen.append([p.requires_grad for p in task.other.parameters()])
        seen.append([p.requires_grad for p in task.other.parameters()])
        first.step()  # max_steps counts optimizer steps: without one the fit would never end (as Lightning)

    task.training_step = step
    Trainer(max_steps=1, **QUIET).fit(task, DataLoader(TensorDataset(torch.randn(2, 2)), batch_size=2))
    assert seen == [[False, False], [True, True]]  # the other optimizer's parameters, then restored


class Grown(Net):
    """A second head the old checkpoint lacks."""

    def __init__(self, lr: float = 0.1) -> None:
        super().__init__(lr)
        self.head = nn.Linear(1, 1)


def test_strict_loading_false_loads_a_partial_checkpoint(tmp_path):
    old = Net()
    trainer = Trainer(max_steps=1, default_root_dir=str(tmp_path), **QUIET)
    trainer.fit(old, DataLoader(TensorDataset(torch.randn(2, 2)), batch_size=2))
    path = os.path.join(str(tmp_path), "old.ckpt")
    trainer.save_checkpoint(path)
    with pytest.raises(Exception, match="head"):
        Grown.load_from_checkpoint(path)
    partial = Grown.load_from_checkpoint(path, strict=False)  # strict=False as torch's load_state_dict
    assert torch.equal(partial.net.weight, old.net.weight)
    Grown.strict_loading = property(lambda self: False)  # a class that always loads partially
    try:
        loaded = Grown.load_from_checkpoint(path)
    finally:
        del Grown.strict_loading
    assert torch.equal(loaded.net.weight, old.net.weight)
