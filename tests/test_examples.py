"""The runnable examples train to a sensible accuracy when called through their main()."""

from __future__ import annotations

import pytest
import torch

from examples.digits import DigitsData, DigitsTask, main, parse_args


def test_digits_trains_to_high_accuracy(tmp_path, capsys):
    acc = main(["--max-epochs", "2", "--root-dir", str(tmp_path)])
    assert acc is not None and acc > 0.85  # 10 classes: chance is 0.1; two epochs reach about 0.93
    assert f"val/acc = {acc:.3f}" in capsys.readouterr().out


def test_digits_bf16_mixed_trains(tmp_path):
    acc = main(["--max-epochs", "1", "--precision", "bf16-mixed", "--no-logger", "--root-dir", str(tmp_path)])
    assert acc is not None and acc > 0.5


def test_digits_cli_overrides_pass_through():
    args = parse_args(["--strategy", "ddp", "--devices", "2", "--precision", "bf16-mixed"])
    assert (args.strategy, args.devices, args.precision) == ("ddp", 2, "bf16-mixed")
    assert parse_args([]).devices == "auto"


def _samples(x: torch.Tensor, y: torch.Tensor) -> list[tuple[tuple[float, ...], int]]:
    """The (image, label) pairs as a sorted list: a multiset that ignores order but not repeats."""
    return sorted(zip(map(tuple, x.tolist()), y.tolist()))


def test_digits_data_split_is_fixed_and_disjoint():
    from sklearn.datasets import load_digits

    digits = load_digits()
    full = _samples(torch.tensor(digits.data, dtype=torch.float32) / 16.0, torch.tensor(digits.target))
    a, b, other_seed, half = (
        DigitsData(),
        DigitsData(),
        DigitsData(split_seed=1),
        DigitsData(val_fraction=0.5),
    )
    for dm in (a, b, other_seed, half):
        dm.setup("fit")
        (train_x, train_y), (val_x, val_y) = dm.train_set.tensors, dm.val_set.tensors
        # every sample of the data set in exactly one split: train + val is the data set, repeats included
        assert _samples(torch.cat([train_x, val_x]), torch.cat([train_y, val_y])) == full
        assert len(dm.val_set) == int(len(full) * dm.val_fraction)
    for i in range(2):  # the same split on every rank (a fixed split seed), another one for another seed
        assert torch.equal(a.train_set.tensors[i], b.train_set.tensors[i])
        assert torch.equal(a.val_set.tensors[i], b.val_set.tensors[i])
    assert not torch.equal(a.val_set.tensors[0], other_seed.val_set.tensors[0])
    val_set = a.val_set
    a.setup("validate")
    assert a.val_set is val_set  # a later stage keeps the split
    x, y = next(iter(a.train_dataloader()))
    logits = DigitsTask()(x)
    assert logits.shape == (64, 10) and x.max() <= 1.0


@pytest.mark.parametrize("name", ["DigitsTask", "DigitsData"])
def test_digits_importable_by_path(name):
    import importlib

    assert getattr(importlib.import_module("examples.digits"), name) is not None
