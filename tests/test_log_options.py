"""self.log and self.log_dict take Lightning's arguments, in its order, and each one does what Lightning's does:
a misspelt keyword is a TypeError (it was silently dropped), enable_graph keeps a logged Metric's graph (and
only that: Lightning stores tensors without grad), add_dataloader_idx
names the keys as Lightning names them, sync_dist reduces the step value at once (rank_zero_only: never), over
sync_dist_group when given. Lightning 2.6 itself runs the same tasks where the result is observable on one
process; the cross-rank half is in tests/test_monitor.py's 2-process run."""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch
import torchmetrics
from conftest import QUIET
from torch.utils.data import DataLoader, TensorDataset

from tandem_core.errors import TaskError
from trainer import Task, Trainer
from trainer.loggers.metrics import MetricStore

pl = pytest.importorskip("pytorch_lightning")


def _data(n: int = 8) -> DataLoader:
    return DataLoader(
        TensorDataset(torch.randn(n, 2, generator=torch.Generator().manual_seed(0))), batch_size=4
    )


def _task(base: type, step: str, log: dict) -> object:
    """A one-layer task of `base` (Task or LightningModule) whose `step` logs with the keywords `log`; what
    `trainer.callback_metrics` held at each batch end (names, and whether each value keeps a graph)."""

    class Logs(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(2, 1)
            self.seen: list[dict[str, bool]] = []

        def training_step(self, batch, batch_idx):
            loss = self.net(batch[0]).pow(2).mean()
            if step == "training_step":
                self.log("loss", loss, **log)
            elif step == "positional":
                self.log("loss", loss, True)  # Lightning's third parameter: prog_bar
            return loss

        def validation_step(self, batch, batch_idx, dataloader_idx=0):
            out = self.net(batch[0]).mean()
            self.log("a", out)
            self.log(f"b{dataloader_idx}", out, **log)

        def on_train_batch_end(self, outputs, batch, batch_idx):
            self.seen.append({k: bool(v.requires_grad) for k, v in self.trainer.callback_metrics.items()})

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Logs()


def _lightning(tmp_path) -> object:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pl.Trainer(
            accelerator="cpu", default_root_dir=str(tmp_path), logger=False, enable_progress_bar=False,
            enable_model_summary=False, enable_checkpointing=False, max_epochs=1,
        )  # fmt: skip


@pytest.mark.parametrize("method", ["log", "log_dict"])
def test_log_and_log_dict_take_lightnings_arguments_in_its_order_and_defaults(method):
    ours = list(inspect.signature(getattr(Task, method)).parameters.values())
    theirs = list(inspect.signature(getattr(pl.LightningModule, method)).parameters.values())
    assert [(p.name, p.kind, p.default) for p in ours] == [(p.name, p.kind, p.default) for p in theirs]


def test_a_misspelt_keyword_is_a_type_error_and_a_positional_prog_bar_is_lightnings(tmp_path):
    task = _task(Task, "training_step", {"on_stpe": True})
    with pytest.raises(TypeError, match="on_stpe"):
        Trainer(max_epochs=1, **QUIET).fit(task, _data())
    trainer = Trainer(max_epochs=1, **QUIET)
    trainer.fit(_task(Task, "positional", {}), _data())
    theirs = _lightning(tmp_path)
    theirs.fit(_task(pl.LightningModule, "positional", {}), _data())
    assert set(trainer.progress_bar_metrics) == set(theirs.progress_bar_metrics) == {"loss"}


def _graph_task(base: type, graph: bool) -> object:
    """Logs its loss and a torchmetrics MeanMetric of it with enable_graph=`graph`; records at each batch end
    whether trainer.callback_metrics' values keep a graph."""

    class Graph(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.net, self.mean, self.seen = torch.nn.Linear(2, 1), torchmetrics.MeanMetric(), []

        def training_step(self, batch, batch_idx):
            loss = self.net(batch[0]).pow(2).mean()
            self.mean(loss)
            self.log("loss", loss, enable_graph=graph)
            self.log("mean", self.mean, enable_graph=graph)
            return loss

        def on_train_batch_end(self, outputs, batch, batch_idx):
            self.seen.append({k: bool(v.requires_grad) for k, v in self.trainer.callback_metrics.items()})

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Graph()


def test_enable_graph_keeps_a_logged_metrics_graph_and_detaches_tensors_as_lightning(tmp_path):
    seen = {}
    for graph in (False, True):
        for name, base, trainer in (
            ("tandem", Task, Trainer(max_epochs=1, **QUIET)),
            ("lightning", pl.LightningModule, _lightning(tmp_path)),
        ):
            task = _graph_task(base, graph)
            trainer.fit(task, _data())
            seen[name, graph] = task.seen
    assert seen["tandem", False] == seen["lightning", False] == [{"loss": False, "mean": False}] * 2
    assert seen["tandem", True] == seen["lightning", True] == [{"loss": False, "mean": True}] * 2


def test_add_dataloader_idx_names_the_keys_as_lightning_and_a_suffixed_name_is_refused(tmp_path):
    keys = {}
    for name, base, trainer in (
        ("tandem", Task, Trainer(**QUIET)),
        ("lightning", pl.LightningModule, _lightning(tmp_path)),
    ):
        for add in (True, False):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                trainer.validate(_task(base, "none", {"add_dataloader_idx": add}), [_data(), _data(4)])
            keys[name, add] = sorted(trainer.callback_metrics)
    assert keys["tandem", True] == keys["lightning", True]
    assert (
        keys["tandem", False]
        == keys["lightning", False]
        == ["a/dataloader_idx_0", "a/dataloader_idx_1", "b0", "b1"]
    )

    class Suffixed(Task):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(2, 1)

        def validation_step(self, batch, batch_idx):
            self.log("x/dataloader_idx_0", self.net(batch[0]).mean())

    class LightningSuffixed(pl.LightningModule):
        validation_step = Suffixed.validation_step

        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(2, 1)

    with pytest.raises(TaskError, match="add_dataloader_idx=False"):
        Trainer(**QUIET).validate(Suffixed(), _data())
    with pytest.raises(pl.utilities.exceptions.MisconfigurationException, match="dataloader_idx"):
        _lightning(tmp_path).validate(LightningSuffixed(), _data())


def test_log_outside_a_trainer_warns_and_records_nothing():
    task = _task(Task, "training_step", {})
    with pytest.warns(UserWarning, match="not attached"):
        task.training_step([torch.ones(2, 2)], 0)


def test_sync_dist_reduces_the_step_value_at_once_over_the_group_and_never_with_rank_zero_only():
    calls = []

    def reduce(t, op, group=None):  # as if a second rank held twice each value
        calls.append((op, group))
        return t * 3 / 2 if op == "mean" else t * 2

    store = MetricStore(reduce)
    store.fx = "training_step"
    store.set_batch(torch.zeros(2, 1))
    store.log("m", torch.tensor(2.0), sync_dist=True, on_step=True, on_epoch=True)
    store.log("s", torch.tensor(2.0), sync_dist=True, reduce_fx="max", sync_dist_group="g")
    store.log("r", torch.tensor(2.0), sync_dist=True, rank_zero_only=True, on_epoch=True)
    assert calls == [("mean", None), ("max", "g")]
    assert store.callback_metrics["m_step"].item() == 3.0  # the reduced step value, as every rank sees it
    assert store.callback_metrics["s"].item() == 4.0
    assert store.callback_metrics["r_step"].item() == 2.0  # logged on rank 0 alone: nothing to wait for
    epoch = store.epoch_end()
    assert calls[2:] == [
        ("sum", None),
        ("sum", None),
    ]  # the mean's weighted sum and weight, from local values
    assert epoch["m_epoch"].item() == 2.0 and epoch["r_epoch"].item() == 2.0


def test_under_dp_positional_options_keep_their_meaning_and_a_misspelt_keyword_fails_as_on_one_device():
    trainer = Trainer(strategy="dp", devices=2, accelerator="cpu", max_epochs=1, **QUIET)
    trainer.fit(_task(Task, "positional", {}), _data())
    assert set(trainer.progress_bar_metrics) == {"loss"}
    with pytest.raises(TypeError, match="on_stpe"):
        Trainer(strategy="dp", devices=2, accelerator="cpu", max_epochs=1, **QUIET).fit(
            _task(Task, "training_step", {"on_stpe": True}), _data()
        )
