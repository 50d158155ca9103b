"""Lightning's utility submodules that Lightning's own tests import (parsing, data, memory, seed, enums), each
compared with Lightning's function on the same inputs: values, warnings and errors."""

from __future__ import annotations

import random
import threading
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch

pl = pytest.importorskip("pytorch_lightning")
from pytorch_lightning.utilities import data as L_data  # noqa: E402
from pytorch_lightning.utilities import enums as L_enums  # noqa: E402
from pytorch_lightning.utilities import memory as L_memory  # noqa: E402
from pytorch_lightning.utilities import parsing as L_parsing  # noqa: E402
from pytorch_lightning.utilities import seed as L_seed  # noqa: E402

from trainer import DataModule, Task, Trainer, seed  # noqa: E402
from trainer.utilities import data as T_data  # noqa: E402
from trainer.utilities import enums as T_enums  # noqa: E402
from trainer.utilities import memory as T_memory  # noqa: E402
from trainer.utilities import parsing as T_parsing  # noqa: E402


def _holders(module: Any, dm: Any, trainer_cls: Any) -> list[Any]:
    """Tasks holding `learning_rate` / `batch_size` in each place Lightning looks (after its parsing tests)."""

    class OwnAttr(module):
        learning_rate = 0

    class InHparams(module):
        hparams = {"learning_rate": 2}

    class Neither(module):
        batch_size = 1

    own, hp, neither, bare = OwnAttr(), InHparams(), Neither(), module()
    trainer = trainer_cls(logger=False, enable_progress_bar=False, enable_model_summary=False)
    datamodule = dm()
    datamodule.batch_size = 8
    trainer.datamodule = datamodule
    for task in (neither, bare):
        task.trainer = trainer
    return [own, hp, neither, bare]


@pytest.mark.parametrize("name", ["learning_rate", "batch_size", "missing"])
def test_lightning_getattr_hasattr_setattr_as_lightnings(name):
    ours = _holders(Task, DataModule, Trainer)
    theirs = _holders(
        pl.LightningModule, pl.LightningDataModule, lambda **k: pl.Trainer(accelerator="cpu", **k)
    )
    for a, b in zip(ours, theirs):
        assert T_parsing.lightning_hasattr(a, name) == L_parsing.lightning_hasattr(b, name)
        if not L_parsing.lightning_hasattr(b, name):
            with pytest.raises(AttributeError, match="is neither stored in the model namespace"):
                T_parsing.lightning_getattr(a, name)
            with pytest.raises(AttributeError, match="is neither stored in the model namespace"):
                T_parsing.lightning_setattr(a, name, 1)
            continue
        assert T_parsing.lightning_getattr(a, name) == L_parsing.lightning_getattr(b, name)
        T_parsing.lightning_setattr(a, name, 128)
        L_parsing.lightning_setattr(b, name, 128)
        assert T_parsing.lightning_getattr(a, name) == L_parsing.lightning_getattr(b, name) == 128


_unpicklable = lambda: None  # noqa: E731


def test_clean_namespace_and_init_keys_as_lightnings():
    class Local:
        pass

    for module in (T_parsing, L_parsing):
        hparams = {"1": None, "2": True, "3": 123, "4": _unpicklable, "5": Local, "6": threading.Lock()}
        with pytest.warns(UserWarning, match="removed from hparams because it cannot be pickled"):
            module.clean_namespace(hparams)
        assert hparams == {"1": None, "2": True, "3": 123}

    class Class:
        def __init__(self, hparams, *my_args, anykw=42, **my_kwargs):
            pass

    class Plain:
        def __init__(self, a):
            pass

    for cls in (Class, Plain):
        assert T_parsing.parse_class_init_keys(cls) == L_parsing.parse_class_init_keys(cls)


def test_collect_init_args_as_lightnings():
    def classes(module):
        class Parent:
            def __init__(self, anyarg, anykw=42, **kwargs):
                super().__init__()
                self.result = module.collect_init_args(__import__("inspect").currentframe(), [])
                self.own = module.get_init_args(__import__("inspect").currentframe())

        class Child(Parent):
            def __init__(self, anyarg, childarg, anykw=42, childkw=42, **kwargs):
                super().__init__(anyarg, anykw=anykw, **kwargs)

        return Child("test1", "test2", anykw=32, childkw=22, otherkw=123)

    ours, theirs = classes(T_parsing), classes(L_parsing)
    assert ours.result == theirs.result and len(ours.result) == 2
    assert ours.own == theirs.own == {"anyarg": "test1", "anykw": 32, "otherkw": 123}


@dataclass
class _Pair:
    a: torch.Tensor
    b: torch.Tensor


class _NoTensors:
    def __init__(self) -> None:
        self.x = torch.randn(7, 2)


BATCHES = [
    torch.zeros(11, 10, 9),
    torch.tensor(3.0),
    {"test": torch.zeros(11, 10)},
    [torch.zeros(11, 10)],
    _Pair(torch.zeros(11, 10), torch.zeros(11, 10)),
    {"test": [{"test": [torch.zeros(11, 10)]}]},
    {"a": [torch.tensor(1), torch.tensor(2)], "b": torch.tensor([1, 2, 3, 4])},
    _Pair(torch.zeros(11, 10), torch.zeros(1)),
    [{"test": torch.zeros(10, 10), "test_1": torch.zeros(11, 10)}],
    (torch.zeros(4), "text"),
    "test string",
    {"test": ["some text"] * 7},
    _NoTensors(),
]


@pytest.mark.parametrize("index", range(len(BATCHES)))
def test_extract_batch_size_as_lightnings(index):
    """The same size, the same ambiguity warning, an error where Lightning raises one."""
    batch = BATCHES[index]
    results = []
    for module in (T_data, L_data):
        module.warning_cache.clear()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                results.append(("size", module.extract_batch_size(batch)))
            except Exception as e:  # noqa: BLE001 (the class is compared below)
                results.append(("error", str(e)))
        results.append([str(w.message) for w in caught if "Trying to infer" in str(w.message)])
    assert results[0] == results[2] and results[1] == results[3]


def test_recursive_detach_as_lightnings():
    x = {"foo": torch.tensor(0), "bar": [torch.tensor(1.0, requires_grad=True), "s"]}
    for module in (T_memory, L_memory):
        y = module.recursive_detach(x, to_cpu=True)
        assert x["bar"][0].requires_grad and not y["bar"][0].requires_grad and y["bar"][1] == "s"
        assert y["foo"] is not x["foo"] or not x["foo"].requires_grad
    ours, theirs = T_memory.recursive_detach(x), L_memory.recursive_detach(x)
    assert type(ours["bar"]) is type(theirs["bar"])


def test_isolate_rng_as_lightnings():
    draws = []
    for isolate in (seed.isolate_rng, L_seed.isolate_rng):
        torch.manual_seed(0), np.random.seed(0), random.seed(0)
        with isolate():
            inside = (torch.rand(2), np.random.rand(2), random.random())
        after = (torch.rand(2), np.random.rand(2), random.random())
        assert torch.equal(inside[0], after[0]) and (inside[1] == after[1]).all() and inside[2] == after[2]
        draws.append(after[0])
    assert torch.equal(draws[0], draws[1])


def test_grad_clip_algorithm_type_as_lightnings():
    for name in ("norm", "value", "norm2", "NORM"):
        assert T_enums.GradClipAlgorithmType.supported_type(
            name
        ) == L_enums.GradClipAlgorithmType.supported_type(name)
    assert T_enums.GradClipAlgorithmType.supported_types() == L_enums.GradClipAlgorithmType.supported_types()
