"""Moving nested batches: containers keep their types, every tensor moves, floats take the param dtype."""

from __future__ import annotations

import dataclasses
from collections import OrderedDict, namedtuple

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from strategies.base import Strategy
from strategies.batch import apply_to_tensors, batch_size_of, first_tensor, move_to_device
from trainer import Task, Trainer

Pair = namedtuple("Pair", ["x", "y"])


@dataclasses.dataclass
class Sample:
    x: torch.Tensor
    meta: dict
    label: str = "a"


@dataclasses.dataclass(frozen=True)
class Frozen:
    x: torch.Tensor
    n: int


@dataclasses.dataclass
class WithDerived:
    x: torch.Tensor
    double: torch.Tensor = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.double = self.x * 2


def _tensors(data) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    apply_to_tensors(data, lambda t: out.append(t) or t)
    return out


def test_nested_containers_keep_types_and_values():
    batch = {
        "tuple": (torch.ones(2), [torch.zeros(3), 5]),
        "pair": Pair(torch.ones(1), torch.arange(3)),
        "sample": Sample(torch.ones(2), {"k": torch.zeros(1)}, "b"),
        "frozen": Frozen(torch.ones(1), 3),
        "od": OrderedDict(a=torch.ones(1)),
        "s": "text",
        "none": None,
    }
    out = apply_to_tensors(batch, lambda t: t + 1)
    assert type(out["tuple"]) is tuple and type(out["tuple"][1]) is list
    assert torch.equal(out["tuple"][0], torch.full((2,), 2.0)) and out["tuple"][1][1] == 5
    assert isinstance(out["pair"], Pair) and torch.equal(out["pair"].y, torch.arange(1, 4))
    assert isinstance(out["sample"], Sample) and out["sample"].label == "b"
    assert torch.equal(out["sample"].meta["k"], torch.ones(1))
    assert (
        isinstance(out["frozen"], Frozen)
        and out["frozen"].n == 3
        and torch.equal(out["frozen"].x, torch.full((1,), 2.0))
    )
    assert type(out["od"]) is OrderedDict
    assert out["s"] == "text" and out["none"] is None
    assert torch.equal(batch["tuple"][0], torch.ones(2))  # the input is not modified
    assert len(_tensors(batch)) == 8


def test_dataclass_with_init_false_field():
    out = apply_to_tensors(WithDerived(torch.ones(2)), lambda t: t * 3)
    assert torch.equal(out.x, torch.full((2,), 3.0))
    assert torch.equal(out.double, torch.full((2,), 6.0))


def test_move_to_device_casts_only_floats():
    batch = (
        torch.ones(2, dtype=torch.float32),
        torch.ones(2, dtype=torch.int64),
        {"m": torch.ones(1, dtype=torch.bool)},
    )
    out = move_to_device(batch, torch.device("cpu"), torch.float64)
    assert [t.dtype for t in _tensors(out)] == [torch.float64, torch.int64, torch.bool]
    out = move_to_device(batch, torch.device("cpu"))
    assert [t.dtype for t in _tensors(out)] == [torch.float32, torch.int64, torch.bool]


def test_first_tensor_and_batch_size():
    assert batch_size_of({"ids": [1, 2], "x": (torch.ones(5, 2),)}) == 5
    assert batch_size_of(Sample(torch.ones(7, 1), {}, "a")) == 7
    assert batch_size_of(Pair(torch.ones(3), torch.ones(4))) == 3
    assert batch_size_of(torch.tensor(1.0)) == 1
    assert batch_size_of(["no tensors"]) == 1
    assert first_tensor({"a": {"b": [torch.zeros(2)]}}).shape == (2,)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_move_to_cuda():
    batch = Pair(torch.ones(2), {"y": [torch.zeros(1)]})
    out = move_to_device(batch, torch.device("cuda", 0))
    assert all(t.device.type == "cuda" for t in _tensors(out))


class NestedData(Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int):
        return {"pair": Pair(torch.full((2,), float(i)), torch.tensor(i)), "extra": [torch.ones(1)]}


def test_trainer_moves_nested_batches(tmp_path):
    seen = []

    class Recorder(Strategy):
        def batch_to_device(self, batch):
            seen.append(type(batch))
            return super().batch_to_device(batch)

    class T(Task):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Linear(2, 1)

        def training_step(self, batch, batch_idx):
            assert isinstance(batch["pair"], Pair) and batch["pair"].x.dtype == torch.float64
            return self.net(batch["pair"].x).sum() + batch["extra"][0].sum() * 0

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    trainer = Trainer(
        strategy=Recorder(accelerator="cpu"),
        precision="64",
        max_epochs=1,
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        default_root_dir=str(tmp_path),
    )
    trainer.fit(T(), DataLoader(NestedData(), batch_size=2))
    assert seen == [dict, dict]
