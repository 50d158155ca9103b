"""The runnable examples train to a sensible accuracy when called through their main()."""

from __future__ import annotations

import pytest

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


def test_digits_data_split_is_fixed_and_disjoint():
    a, b = DigitsData(), DigitsData()
    a.setup("fit")
    b.setup("fit")
    assert len(a.train_set) + len(a.val_set) == 1797
    assert len(a.val_set) == int(1797 * 0.2)
    assert (a.val_set.tensors[1] == b.val_set.tensors[1]).all()  # same split on every rank
    x, y = next(iter(a.train_dataloader()))
    logits = DigitsTask()(x)
    assert logits.shape == (64, 10) and x.max() <= 1.0


@pytest.mark.parametrize("name", ["DigitsTask", "DigitsData"])
def test_digits_importable_by_path(name):
    import importlib

    assert getattr(importlib.import_module("examples.digits"), name) is not None
