"""CombinedLoader against Lightning's own (pytorch_lightning.utilities.CombinedLoader) on the same iterables:
every mode, dicts/lists/nested collections, limits, len, the yielded (batch, batch_idx, dataloader_idx), the
flattened setter, stateful iterables and the errors."""

from __future__ import annotations

import pytest
import torch
from pytorch_lightning.utilities import CombinedLoader as LightningCombined
from torch.utils.data import DataLoader, IterableDataset

from trainer.utilities import CombinedLoader

MODES = ["min_size", "max_size_cycle", "max_size", "sequential"]


def _collections():
    return {
        "dict": lambda: {"a": DataLoader(range(6), batch_size=4), "b": DataLoader(range(15), batch_size=5)},
        "list": lambda: [DataLoader(range(7), batch_size=2), DataLoader(range(3)), DataLoader(range(10), batch_size=3)],
        "nested": lambda: {"x": [DataLoader(range(5), batch_size=2), DataLoader(range(9), batch_size=4)],
                           "y": {"z": DataLoader(range(4))}},
        "tuple": lambda: (DataLoader(range(8), batch_size=3), DataLoader(range(2))),
        "one": lambda: DataLoader(range(5), batch_size=2),
    }  # fmt: skip


def _as_plain(x):
    """Batches as nested Python values (tensors to lists), to compare the two loaders' outputs exactly."""
    if isinstance(x, torch.Tensor):
        return x.tolist()
    if isinstance(x, dict):
        return {k: _as_plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_as_plain(v) for v in x)
    return x


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", list(_collections()))
@pytest.mark.parametrize("limits", [None, 2, [1, 3, 2, 5]])
def test_same_batches_and_len_as_lightning(mode, shape, limits):
    make = _collections()[shape]
    ours, theirs = CombinedLoader(make(), mode), LightningCombined(make(), mode)
    if isinstance(limits, list):
        limits = (limits * 2)[: len(ours.flattened)]
    ours.limits, theirs.limits = limits, limits
    assert len(ours.flattened) == len(theirs.flattened)
    iter(ours), iter(theirs)
    assert len(ours) == len(theirs)
    # Lightning's min_size and cycle iterators ignore the limits while iterating (the loops stop at len())
    got, want = [_as_plain(x) for x in ours], [_as_plain(x) for x in theirs]
    assert got == want and got, (mode, shape, got, want)
    assert ours.num_batches() == len(theirs)


def test_batch_idx_and_dataloader_idx_in_sequential_mode():
    loaders = {"a": DataLoader(range(4), batch_size=2), "b": [DataLoader(range(3)), DataLoader(range(2))]}
    got = [(b.tolist(), i, d) for b, i, d in CombinedLoader(loaders, "sequential")]
    assert [(i, d) for _, i, d in got] == [(0, 0), (1, 0), (0, 1), (1, 1), (2, 1), (0, 2), (1, 2)]
    want = [(b.tolist(), i, d) for b, i, d in LightningCombined(loaders, "sequential")]
    assert got == want


def test_properties_and_flattened_setter_match_lightning():
    make = _collections()["nested"]
    ours, theirs = CombinedLoader(make()), LightningCombined(make())
    assert ours.mode == theirs._mode == "min_size"  # Lightning's default mode of the class itself
    assert type(ours.sampler) is type(theirs.sampler) and set(ours.sampler) == set(theirs.sampler)
    new = [DataLoader(range(n)) for n in (1, 2, 3)]
    ours.flattened, theirs.flattened = new, new
    assert ours.iterables == theirs.iterables  # the collection rebuilt with the new loaders
    for obj in (ours, theirs):
        with pytest.raises(ValueError, match="Mismatch in flattened length"):
            obj.flattened = new[:2]
        with pytest.raises(ValueError, match="Mismatch in number of limits"):
            obj.limits = [1]
    with pytest.raises(ValueError, match="Unsupported mode"):
        CombinedLoader(new, "zip")
    with pytest.raises(RuntimeError, match="iter"):
        len(CombinedLoader(new))


class Counter:
    """A stateful iterable (state_dict/load_state_dict): counts what it yielded."""

    def __init__(self) -> None:
        self.n = 0

    def __iter__(self):
        for i in range(3):
            self.n += 1
            yield i

    def state_dict(self):
        return {"n": self.n}

    def load_state_dict(self, state):
        self.n = state["n"]


def test_state_dicts_of_stateful_iterables():
    ours, theirs = CombinedLoader([Counter(), DataLoader(range(2)), Counter()]), None
    theirs = LightningCombined([Counter(), DataLoader(range(2)), Counter()])
    for loader in (ours, theirs):
        list(iter(loader))
    assert (
        ours._state_dicts() == theirs._state_dicts() == [{"n": 3}, {"n": 2}]
    )  # min_size: the first drew a 3rd
    ours._load_state_dicts([{"n": 7}, {"n": 9}])
    assert [c.n for c in (ours.flattened[0], ours.flattened[2])] == [7, 9]
    with pytest.raises(RuntimeError, match="2 stateful loaders, but found 1"):
        ours._load_state_dicts([{"n": 1}])


class Stream(IterableDataset):
    def __iter__(self):
        return iter(range(5))


def test_an_iterable_without_length():
    loaders = [DataLoader(Stream(), batch_size=2), DataLoader(range(4), batch_size=2)]
    ours = iter(CombinedLoader(loaders, "min_size"))
    assert len(ours) == 2 == len(iter(LightningCombined(loaders, "min_size")))
    cycle = iter(CombinedLoader(loaders, "max_size_cycle"))
    assert cycle.num_batches() == float("inf")
    with pytest.raises(TypeError, match="has no length"):
        len(cycle)
    assert [_as_plain(b) for b, _, _ in cycle] == [
        _as_plain(b) for b, _, _ in LightningCombined(loaders, "max_size_cycle")
    ]
