"""self.log: batch-size-weighted epoch means, reduce_fx, step values, torchmetrics objects, to_floats."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import torchmetrics
from conftest import QUIET
from torch.utils.data import DataLoader, TensorDataset

from tandem_core.errors import ConfigError, TaskError
from trainer import Task, Trainer
from trainer.loggers.metrics import MetricStore, to_floats


def data(n: int = 10, seed: int = 0) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(n, 4, generator=g), torch.randint(0, 3, (n,), generator=g))


class Frozen(Task):
    """A classifier whose weights never change (lr=0), so epoch means can be computed by hand."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Linear(4, 3)
        self.acc = torchmetrics.classification.MulticlassAccuracy(num_classes=3, average="micro")
        self.count = torchmetrics.SumMetric()

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("train/loss", loss, on_step=True, on_epoch=True)
        self.log("train/max_loss", loss, on_epoch=True, reduce_fx="max")
        self.log("train/n", float(len(y)), on_step=False, on_epoch=True, reduce_fx="sum")
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self.net(x)
        self.log("val/loss", F.cross_entropy(logits, y))
        self.acc(logits, y)
        self.log("val/acc", self.acc)
        self.count.update(torch.ones(len(y)))
        self.log("val/count", self.count)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def test_epoch_means_are_batch_size_weighted_with_uneven_last_batch():
    task, ds = Frozen(), data(10)
    trainer = Trainer(max_epochs=2, num_sanity_val_steps=0, **QUIET)
    trainer.fit(task, DataLoader(ds, batch_size=4), DataLoader(ds, batch_size=3))  # 4+4+2 and 3+3+3+1
    x, y = ds.tensors
    with torch.no_grad():
        losses = F.cross_entropy(task.net(x), y, reduction="none")
        acc = (task.net(x).argmax(1) == y).float().mean()
    m = trainer.callback_metrics
    assert m["train/loss_epoch"] == pytest.approx(losses.mean().item(), abs=1e-6)
    assert m["train/loss"] == pytest.approx(losses.mean().item(), abs=1e-6)
    batch_means = [losses[i : i + 4].mean().item() for i in (0, 4, 8)]
    assert m["train/loss_epoch"] != pytest.approx(sum(batch_means) / 3, abs=1e-4)  # unweighted would differ
    assert m["train/max_loss"] == pytest.approx(max(batch_means), abs=1e-6)
    assert m["train/n"] == 10
    assert m["val/loss"] == pytest.approx(losses.mean().item(), abs=1e-6)
    assert m["val/acc"] == pytest.approx(acc.item(), abs=1e-6)
    assert m["val/count"] == 10  # the Metric was reset after each epoch: 10, not 20
    assert task.count.update_count == 0 and task.acc.update_count == 0


class MetricTask(Frozen):
    def test_step(self, batch, batch_idx):
        self.validation_step(batch, batch_idx)


def test_metric_object_in_test_equals_hand_accuracy():
    task, ds = MetricTask(), data(23, seed=1)
    trainer = Trainer(**QUIET)
    (result,) = trainer.test(task, DataLoader(ds, batch_size=5))
    x, y = ds.tensors
    with torch.no_grad():
        acc = (task.net(x).argmax(1) == y).float().mean().item()
    assert result["val/acc"] == pytest.approx(acc, abs=1e-6)
    assert result["val/count"] == 23


def test_step_values_are_written_only_in_the_batch_that_logged_them():
    store = MetricStore(lambda t, op: t)
    store.fx = "training_step"
    store.set_batch(torch.zeros(2, 1))
    store.log("a", torch.tensor(1.0))
    store.log("b", torch.tensor(2.0), on_epoch=True)
    assert store.step_metrics() == {"a": torch.tensor(1.0), "b_step": torch.tensor(2.0)}
    store.set_batch(torch.zeros(2, 1))
    store.log("a", torch.tensor(3.0))
    assert store.step_metrics() == {"a": torch.tensor(3.0)}  # 'b' was not logged in this batch
    store.log("c", torch.tensor(4.0), logger=False, prog_bar=True)
    assert "c" not in store.step_metrics()
    assert store.progress_bar_metrics() == {"c": 4.0}


def test_progress_bar_shows_train_step_values_and_last_epoch_values_of_every_stage():
    store = MetricStore(lambda t, op: t)
    store.fx = "training_step"
    store.set_batch(torch.zeros(4, 1))
    store.log("loss", torch.tensor(1.5), prog_bar=True)
    store.reset("val")
    store.fx = "validation_step"
    store.set_batch(torch.zeros(4, 1))
    store.log("val/acc", torch.tensor(0.25), prog_bar=True)
    store.epoch_end()
    store.switch("train")
    assert store.progress_bar_metrics() == {"loss": 1.5, "val/acc": 0.25}


def test_logged_values_stay_tensors_on_device_until_written():
    store = MetricStore(lambda t, op: t)
    store.fx = "training_step"
    store.set_batch(torch.zeros(3, 1))
    value = torch.tensor(2.0, requires_grad=True) * 1
    store.log("x", value, on_epoch=True)
    assert isinstance(store.callback_metrics["x_step"], torch.Tensor)
    assert not store.callback_metrics["x_step"].requires_grad
    out = store.epoch_end()
    assert out["x_epoch"].item() == 2.0


def test_sync_dist_reduces_sum_and_weight_at_epoch_end():
    calls = []

    def fake_reduce(t, op):  # as if a second rank held the same values
        calls.append(op)
        return t * 2

    store = MetricStore(fake_reduce)
    store.fx = "training_step"
    store.set_batch(torch.zeros(2, 1))
    store.log("m", torch.tensor(3.0), on_epoch=True, on_step=False, sync_dist=True)
    store.set_batch(torch.zeros(1, 1))
    store.log("m", torch.tensor(6.0), on_epoch=True, on_step=False, sync_dist=True)
    out = store.epoch_end()
    assert calls == ["sum", "sum"]
    assert out["m"].item() == pytest.approx((3 * 2 + 6) / 3)


def test_log_errors_name_the_problem():
    store = MetricStore(lambda t, op: t)
    store.fx = "training_step"
    with pytest.raises(TaskError, match="shape"):
        store.log("v", torch.ones(3))
    with pytest.raises(TaskError, match="got str"):
        store.log("v", "high")
    with pytest.raises(ConfigError, match="reduce_fx"):
        store.log("v", 1.0, reduce_fx="median")


def test_to_floats_copies_once_per_device(monkeypatch):
    calls = {"tolist": 0, "item": 0}
    orig_tolist, orig_item = torch.Tensor.tolist, torch.Tensor.item

    def tolist(self):
        calls["tolist"] += 1
        return orig_tolist(self)

    def item(self):
        calls["item"] += 1
        return orig_item(self)

    monkeypatch.setattr(torch.Tensor, "tolist", tolist)
    monkeypatch.setattr(torch.Tensor, "item", item)
    out = to_floats({"a": torch.tensor(1.5), "b": torch.tensor(2), "c": 3, "d": torch.tensor([0.25])})
    assert out == {"a": 1.5, "b": 2.0, "c": 3.0, "d": 0.25}
    assert list(out) == ["a", "b", "c", "d"]
    assert calls == {"tolist": 1, "item": 0}


class SyncTask(MetricTask):
    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self.net(x)
        self.log("val/loss", F.cross_entropy(logits, y), sync_dist=True)
        self.acc(logits, y)
        self.log("val/acc", self.acc)


class StepSyncTask(Task):
    """Logs a rank-dependent value per step with each of sync_dist's variants; records the step values every
    rank then sees, and in on_train_end checks the strategy's group and sync_grads collectives."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(4, 3)
        self.seen: list[dict[str, float]] = []
        self.extra: dict[str, float] = {}

    def setup(self, stage):
        import torch.distributed as dist

        self.group = dist.new_group([0, 1])  # every rank creates it, at the same moment

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        v = torch.tensor(float((self.global_rank + 1) * (batch_idx + 1)))
        self.log("s/mean", v, sync_dist=True)
        self.log("s/max", v, sync_dist=True, reduce_fx="max")
        self.log("s/group", v, sync_dist=True, sync_dist_group=self.group)
        self.log("s/rank_zero_only", v, sync_dist=True, rank_zero_only=True)
        self.log("s/local", v)
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.seen.append(
            {k: v.item() for k, v in self.trainer.callback_metrics.items() if k.startswith("s/")}
        )

    def on_train_end(self):
        strategy, rank = self.trainer.strategy, self.global_rank
        t = torch.tensor([float(rank + 1)], requires_grad=True)
        gathered = self.all_gather(t, sync_grads=True)
        (gathered.sum() * (rank + 1)).backward()  # each rank's gradient: the sum of every rank's factor
        self.extra = {
            "gathered": gathered.detach().flatten().tolist(),
            "grad": t.grad.item(),
            "group_sum": strategy.reduce(t.detach(), "sum", group=self.group).item(),
            "group_gather": self.all_gather(t.detach(), group=self.group).flatten().tolist(),
        }

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)
