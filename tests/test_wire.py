"""strategies/wire.py: what the object collectives send comes back equal to what plain pickling gives (dtypes,
shapes, views, empty and 0-dim tensors, devices, other objects), without a torch.save call per tensor."""

from __future__ import annotations

import pickle
from typing import Any
from unittest import mock

import torch

from strategies.wire import Packed


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return (
            type(a) is type(b) and a.dtype == b.dtype and a.shape == b.shape and a.device == b.device
            and a.requires_grad == b.requires_grad and torch.equal(a.detach(), b.detach())
        )  # fmt: skip
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return bool(a == b)


def test_packed_objects_come_back_as_plain_pickling_gives_them_without_torch_save():
    base = torch.arange(12, dtype=torch.float64).reshape(3, 4)
    obj = {
        "rng": torch.get_rng_state(),
        "tensors": [base.t(), base[1:, ::2], torch.tensor(2.5, dtype=torch.bfloat16), torch.zeros(0, 3)],
        "kinds": (torch.tensor([True, False]), torch.tensor([1 + 2j]), torch.tensor([7], dtype=torch.int8)),
        "param": torch.nn.Parameter(
            torch.ones(2)
        ),  # (a subclass, and a tensor that requires grad: pickled as before)
        "plain": {"step": 3, "name": "x", "none": None},
    }
    with mock.patch("torch.save", wraps=torch.save) as save:
        plain = pickle.dumps(obj)
        calls = save.call_count
        wire = pickle.dumps(Packed(obj))
    assert (
        calls > 0 and save.call_count == calls
    )  # plain pickling calls torch.save per storage; Packed does not
    assert _same(pickle.loads(wire), pickle.loads(plain))
    assert _same(pickle.loads(wire), obj)
