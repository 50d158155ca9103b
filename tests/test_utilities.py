"""trainer.utilities against pytorch_lightning.utilities, name by name, on the same inputs: the returned values
and dict keys, the warnings (category, message, the caller's line) and log records, the errors; and the
`self.log_dict(grad_norm(self, norm_type=2))` idiom in a Tandem fit against a Lightning fit."""

from __future__ import annotations

import collections
import dataclasses
import logging
import warnings

import pytest
import pytorch_lightning as pl
import pytorch_lightning.utilities as L
import pytorch_lightning.utilities.rank_zero as LR
import torch
from conftest import FAST
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import trainer
import trainer.utilities as T
from trainer import Task, Trainer

NOT_COVERED: set[str] = set()  # every name of Lightning's utilities.__all__ is in ours


def test_every_public_name_of_lightnings_utilities_is_there():
    assert set(L.__all__) - set(T.__all__) == NOT_COVERED
    for name in T.__all__:
        assert getattr(T, name) is not None
    assert trainer.rank_zero_only is T.rank_zero_only


def _emit(module, fn_name: str, *args, **kwargs):
    """Call `fn_name` from one line of this file; returns that line's number and the warnings/records."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = _line() + 1
        getattr(module, fn_name)(*args, **kwargs)
    return line, [(w.category.__mro__[1:], str(w.message), w.filename, w.lineno) for w in caught]


def _line() -> int:
    import inspect

    return inspect.currentframe().f_back.f_lineno  # type: ignore[union-attr]


@pytest.mark.parametrize("name", ["rank_zero_warn", "rank_zero_deprecation"])
def test_rank_zero_warnings_point_at_the_caller_like_lightnings(name):
    line_t, ours = _emit(T, name, "look here")
    line_l, theirs = _emit(L, name, "look here")
    assert len(ours) == len(theirs) == 1
    (bases_t, msg_t, file_t, at_t), (bases_l, msg_l, file_l, at_l) = ours[0], theirs[0]
    assert msg_t == msg_l == "look here" and file_t == file_l == __file__
    assert (at_t, at_l) == (line_t, line_l)
    want = DeprecationWarning if name == "rank_zero_deprecation" else Warning
    assert want in bases_t and want in bases_l


@pytest.mark.parametrize("name,level", [("rank_zero_info", logging.INFO), ("rank_zero_debug", logging.DEBUG)])
def test_rank_zero_logging_like_lightnings(caplog, name, level):
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.DEBUG, logger="pytorch_lightning")  # (Lightning's package logger is at INFO)
    getattr(T, name)("hello %s", "there")
    getattr(LR, name)("hello %s", "there")
    (ours, theirs) = [r for r in caplog.records if r.getMessage() == "hello there"]
    assert ours.levelno == theirs.levelno == level
    assert ours.pathname == theirs.pathname == __file__  # the caller's line, not the helper's
    assert ours.name == "trainer.utilities.rank_zero"


def test_rank_zero_only_on_other_ranks(monkeypatch, caplog):
    calls = []
    fn = T.rank_zero_only(lambda: calls.append(1) or "ran", default="skipped")
    assert fn() == "ran"
    monkeypatch.setenv("RANK", "1")
    assert fn() == "skipped" and T.rank_zero_only(lambda: 1)() is None and calls == [1]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        T.rank_zero_warn("not on rank 1")
        T.rank_zero_deprecation("nor this")
    caplog.set_level(logging.DEBUG)
    T.rank_zero_info("nor this")
    assert not caught and not caplog.records
    assert T.rank_zero_only.rank == 1  # (read as Lightning users read it: `if rank_zero_only.rank == 0`)
    T.rank_zero_only.rank = 0  # (Lightning's way of fixing the rank)
    try:
        assert fn() == "ran" and T.rank_zero_only.rank == 0
    finally:
        del T.rank_zero_only.rank
    assert T.rank_zero_only.rank == 1 and fn() == "skipped"


def _with_grads() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2), nn.Linear(2, 2))
    model(torch.randn(5, 3)).pow(2).sum().backward()
    model[3].bias.grad = None  # a parameter without a gradient is left out
    return model


@pytest.mark.parametrize("norm_type,sep", [(2, "/"), (1.0, "/"), ("inf", "_"), (3, ".")])
def test_grad_norm_like_lightnings(norm_type, sep):
    model = _with_grads()
    ours, theirs = T.grad_norm(model, norm_type, sep), L.grad_norm(model, norm_type, sep)
    assert list(ours) == list(theirs) and len(ours) == 6
    for key in ours:
        torch.testing.assert_close(ours[key], theirs[key])
    assert T.grad_norm(nn.Linear(2, 2), 2) == L.grad_norm(nn.Linear(2, 2), 2) == {}
    for bad in (0, -1):
        with pytest.raises(ValueError, match="positive number"):
            T.grad_norm(model, bad)


class Normed:
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Linear(3, 1)

    def training_step(self, batch, batch_idx):
        return self.net(batch[0]).pow(2).mean()

    def on_before_optimizer_step(self, optimizer):
        self.log_dict(grad_norm(self, norm_type=2))  # noqa: F821 (the module's own grad_norm, set below)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_the_log_dict_grad_norm_idiom_logs_lightnings_values():
    data = DataLoader(
        TensorDataset(torch.randn(8, 3, generator=torch.Generator().manual_seed(1))), batch_size=4
    )
    results = []
    for base, grad_norm, make in (
        (Task, T.grad_norm, Trainer),
        (pl.LightningModule, L.grad_norm, pl.Trainer),
    ):
        globals()["grad_norm"] = grad_norm
        task = type("Idiom", (Normed, base), {})()
        kw = FAST if make is Trainer else dict(FAST, devices=1)
        t = make(max_epochs=1, **kw)
        t.fit(task, data)
        results.append({k: float(v) for k, v in t.callback_metrics.items()})
    assert results[0] == pytest.approx(results[1]) and set(results[0]) == {
        "grad_2.0_norm/net.weight", "grad_2.0_norm/net.bias", "grad_2.0_norm_total"}  # fmt: skip


Point = collections.namedtuple("Point", "x y")


@dataclasses.dataclass
class Pair:
    a: torch.Tensor
    b: list


class Movable:
    """Any object with .to(device) is moved (Lightning's _TransferableDataType)."""

    def __init__(self) -> None:
        self.moved_to = None

    def to(self, device):
        self.moved_to = str(device)
        return self


def test_move_data_to_device_like_lightnings():
    def batch():
        t = torch.arange(4.0)
        return {
            "t": t,
            "list": [t, 1, "s"],
            "tuple": (t, Point(t, 2)),
            "pair": Pair(t, [t]),
            "obj": Movable(),
        }

    ours, theirs = T.move_data_to_device(batch(), "cpu"), L.move_data_to_device(batch(), torch.device("cpu"))
    assert type(ours["tuple"][1]) is Point and type(ours["pair"]) is Pair
    assert repr({k: v for k, v in ours.items() if k != "obj"}) == repr(
        {k: v for k, v in theirs.items() if k != "obj"}
    )
    assert ours["obj"].moved_to == theirs["obj"].moved_to == "cpu"
    assert T.move_data_to_device(torch.ones(2, dtype=torch.float64), "meta").device.type == "meta"


def test_measure_flops_attribute_dict_is_picklable_and_workers_like_lightnings():
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    x = torch.randn(4, 8)
    for loss in (None, lambda y: y.sum()):
        assert (
            T.measure_flops(model, lambda: model(x), loss)
            == L.measure_flops(model, lambda: model(x), loss)
            > 0
        )
    values = dict(b=nn.Linear(2, 2), a=1, long_name="x")
    ours, theirs = T.AttributeDict(values), L.AttributeDict(values)
    assert repr(ours) == repr(theirs) and repr(T.AttributeDict()) == repr(L.AttributeDict()) == ""
    ours.c, theirs.c = 3, 3
    del ours.a, theirs.a
    assert dict(ours) == dict(theirs) and ours.c == 3
    with pytest.raises(AttributeError):
        _ = ours.missing
    with pytest.raises(KeyError):
        del ours.missing
    for obj in (1, "s", [1, {2: 3}], lambda: 0, torch.ones(2), (x for x in []), nn.Linear(1, 1)):
        assert T.is_picklable(obj) == L.is_picklable(obj)
    for n in (1, 2, 3, 64):
        assert T.suggested_max_num_workers(n) == L.suggested_max_num_workers(n)
    for module in (T, L):
        with pytest.raises(ValueError, match="should be >= 1"):
            module.suggested_max_num_workers(0)


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(10, 4)
        self.body = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
        self.head = nn.Linear(4, 10)
        self.head.weight = self.embed.weight
        self.body[1].bias = self.body[0].bias


def test_shared_parameters_like_lightnings():
    ours, theirs = T.find_shared_parameters(Tied()), L.find_shared_parameters(Tied())
    assert ours == theirs == [["embed.weight", "head.weight"], ["body.0.bias", "body.1.bias"]]
    assert T.find_shared_parameters(nn.Linear(2, 2)) == L.find_shared_parameters(nn.Linear(2, 2)) == []
    for module in (T, L):
        model = Tied()
        model.head.weight = nn.Parameter(model.head.weight.detach().clone())  # untied (a load does this)
        model.body[1].bias = nn.Parameter(torch.zeros(4))
        assert module.set_shared_parameters(model, ours) is model
        assert model.head.weight is model.embed.weight and model.body[1].bias is model.body[0].bias


def test_enums_and_possible_user_warnings_like_lightnings():
    for module in (T, L):
        clip = module.GradClipAlgorithmType
        assert clip.NORM == "norm" == clip.from_str("NORM") and clip.VALUE == "VALUE"
        assert clip.from_str("value", source="value") is clip.VALUE
        with pytest.raises(ValueError, match="Invalid match"):
            clip.from_str("other")
    assert {m.value for m in T.GradClipAlgorithmType} == {m.value for m in L.GradClipAlgorithmType}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        T.disable_possible_user_warnings()
        warnings.warn("maybe", T.PossibleUserWarning, stacklevel=1)
        warnings.warn("surely", UserWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["surely"]


def test_is_shared_filesystem_in_one_process(tmp_path):
    trainer_ = Trainer(**FAST)
    assert T.is_shared_filesystem(trainer_.strategy, tmp_path) is True
    assert T.is_shared_filesystem(trainer_.strategy, "s3://bucket/x") is True
