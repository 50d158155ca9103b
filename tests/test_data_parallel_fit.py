"""DataParallelStrategy through the Trainer: the weights, logged values, validation and predictions of a
single-device run, the same weights as DDP, torch's DataParallel on GPUs, and reproducible dropout."""

from __future__ import annotations

import threading

import pytest
import torch
import torch.nn.functional as F
from conftest import QUIET
from helpers.dp import CPU, MLP, assert_same, grads_of, make_data
from torch.utils.data import DataLoader

from strategies import resolve_strategy
from strategies.data_parallel import DataParallelStrategy
from tandem_core.errors import ConfigError
from trainer import Trainer


# ----- through the Trainer: same weights, logs, validation, prediction --------------------------------------
def fit(strategy: str, devices: int = 1, accumulate: int = 1, batchnorm: bool = False, **kwargs):
    task = MLP(batchnorm)
    calls: list[str] = []
    trainer = Trainer(
        strategy=strategy,
        devices=devices,
        accelerator="cpu",
        max_epochs=2,
        accumulate_grad_batches=accumulate,
        num_sanity_val_steps=0,
        log_every_n_steps=1,
        **QUIET,
    )
    real_log = trainer.metric_store.log

    def counting(name, value, *args, **kw):  # every self.log that reaches the metric store
        calls.append(name)
        return real_log(name, value, *args, **kw)

    trainer.metric_store.log = counting
    trainer.fit(task, DataLoader(make_data(), batch_size=7), DataLoader(make_data(20, seed=1), batch_size=6))
    return task, trainer, calls


@pytest.mark.parametrize("replicas", [2, 3])
@pytest.mark.parametrize("accumulate,batchnorm", [(1, False), (1, True), (3, False), (3, True)])
def test_fit_equals_single_device(replicas, accumulate, batchnorm):
    reference, ref_trainer, ref_calls = fit("single", accumulate=accumulate, batchnorm=batchnorm)
    task, trainer, calls = fit("dp", replicas, accumulate=accumulate, batchnorm=batchnorm)
    assert_same(task.state_dict(), reference.state_dict())
    assert trainer.global_step == ref_trainer.global_step
    # 50 samples in batches of 7 (the last one of 1 sample) over `replicas` chunks, two epochs
    assert len(task.seen) == 2 * (7 * len(torch.arange(7).chunk(replicas)) + 1)
    # logged once per step, not once per replica, with the full-batch values
    assert calls == ref_calls
    assert trainer.callback_metrics.keys() == ref_trainer.callback_metrics.keys()
    for k, v in ref_trainer.callback_metrics.items():
        torch.testing.assert_close(trainer.callback_metrics[k], v, atol=1e-6, rtol=0, msg=k)
    assert trainer.callback_metrics["train/n"].item() == 50  # reduce_fx="sum" over replicas and batches


def test_no_replica_thread_outlives_the_stage():
    """Regression (issue 24): a dp fit ended in "terminate called without an active exception" (exit 134)
    about 1 run in 30 after fit returned: its replica threads were only told to stop, and one still inside
    torch code when the interpreter shut down was ended there by Python. Each stage's end joins them."""
    before = set(threading.enumerate())
    dp_threads = lambda: [t for t in set(threading.enumerate()) - before if t.name.startswith("tandem-dp-")]  # noqa: E731
    task, trainer, _ = fit("dp", 3)
    assert not dp_threads()
    trainer.validate(task, DataLoader(make_data(20, seed=1), batch_size=6))
    assert not dp_threads()


def test_validate_and_predict_through_dp():
    reference, task = MLP(), MLP()
    loader = DataLoader(make_data(23, seed=2), batch_size=8)
    single = Trainer(strategy="single", accelerator="cpu", **QUIET)
    dp = Trainer(strategy="dp", devices=3, accelerator="cpu", **QUIET)
    expected, got = single.validate(reference, loader), dp.validate(task, loader)
    assert expected[0].keys() == got[0].keys()
    for k in expected[0]:
        assert got[0][k] == pytest.approx(expected[0][k], abs=1e-6)
    preds, ref_preds = dp.predict(task, loader), single.predict(reference, loader)
    assert [p.shape[0] for p in preds] == [8, 8, 7]
    torch.testing.assert_close(torch.cat(preds), torch.cat(ref_preds), atol=1e-6, rtol=0)
    assert not torch.cat(preds).requires_grad


def test_torchmetrics_metrics_are_merged_over_replicas():
    from torchmetrics.classification import MulticlassAccuracy

    class WithMetric(MLP):
        def __init__(self):
            super().__init__()
            self.acc = MulticlassAccuracy(num_classes=3, average="macro")

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.acc(self(x), y)
            self.log("val/acc", self.acc, on_step=True, on_epoch=True)
            self.log("val/step_acc", self.acc._forward_cache, on_step=True, on_epoch=False)

        def on_validation_batch_end(self, outputs, batch, batch_idx):
            self.last_step = float(self.acc._forward_cache)  # what self.log read: the merged batch value

        def on_validation_epoch_end(self):
            self.updates = self.acc._update_count

    loader = DataLoader(make_data(41, seed=3), batch_size=9)
    results = {}
    for strategy, devices in (("single", 1), ("dp", 3)):
        trainer = Trainer(strategy=strategy, devices=devices, accelerator="cpu", **QUIET)
        task = WithMetric()
        out = trainer.validate(task, loader)[0]
        results[strategy] = (out, task.last_step, task.updates)
    (ref, ref_step, ref_count), (got, step, count) = results["single"], results["dp"]
    assert got["val/acc_epoch"] == pytest.approx(
        ref["val/acc_epoch"], abs=1e-6
    )  # macro: not a mean of chunks
    assert step == pytest.approx(ref_step, abs=1e-6)  # the last batch's value over all its replicas
    assert count == ref_count == 5  # one update per batch


def test_replicas_follow_grad_mode_autocast_and_device():
    seen = []

    class Probe(MLP):
        def training_step(self, batch, batch_idx):
            seen.append((torch.is_grad_enabled(), torch.is_autocast_enabled("cpu"), self.device))
            return super().training_step(batch, batch_idx)

        def validation_step(self, batch, batch_idx):
            seen.append((torch.is_grad_enabled(), torch.is_autocast_enabled("cpu"), self.device))

    trainer = Trainer(
        strategy="dp", devices=2, accelerator="cpu", precision="bf16-mixed", max_steps=1, **QUIET
    )
    data = DataLoader(make_data(8), batch_size=8)
    trainer.fit(Probe(), data, data)
    # sanity-check validation (no grad), one training step, validation at the end of the epoch
    assert seen == [(False, True, CPU)] * 2 + [(True, True, CPU)] * 2 + [(False, True, CPU)] * 2


def test_config_names_and_devices():
    s = resolve_strategy("dp", {"accelerator": "cpu", "devices": 3, "precision": "32-true"}, {"devices"})
    assert isinstance(s, DataParallelStrategy) and s.device_list == [CPU] * 3 and s.world_size == 1
    with pytest.raises(ConfigError, match="devices >= 1"):
        DataParallelStrategy(accelerator="cpu", devices=0)
    if torch.cuda.device_count() < 8:
        with pytest.raises(ConfigError):
            DataParallelStrategy(accelerator="cuda", devices=8)


# ----- switching strategies changes nothing else -------------------------------------------------------------
def _fit_ddp(rank: int, world_size: int) -> dict[str, torch.Tensor]:
    task = MLP()
    trainer = Trainer(strategy="ddp", devices=world_size, accelerator="cpu", max_epochs=2, **QUIET)
    trainer.fit(task, DataLoader(make_data(48), batch_size=4))  # 4 per rank: the global batch is 8
    return task.state_dict()


def test_single_dp_and_ddp_give_the_same_weights(dist_run):
    weights = {}
    for strategy, devices in (("single", 1), ("dp", 2)):
        task = MLP()
        Trainer(strategy=strategy, devices=devices, accelerator="cpu", max_epochs=2, **QUIET).fit(
            task, DataLoader(make_data(48), batch_size=8)
        )
        weights[strategy] = task.state_dict()
    assert_same(weights["dp"], weights["single"])
    for state in dist_run(_fit_ddp):
        assert_same(state, weights["single"], atol=1e-5)


# ----- the reference on GPUs ------------------------------------------------------------------------------------
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")
def test_equals_torch_data_parallel_on_cuda():
    x, y = (t.cuda() for t in make_data(13).tensors)
    reference, task = MLP().cuda(), MLP().cuda()
    F.cross_entropy(torch.nn.DataParallel(reference.net, device_ids=[0, 1])(x), y).backward()
    strategy = DataParallelStrategy(accelerator="cuda", devices=2)
    strategy.setup(task)
    strategy.step(task, "training_step", (x, y), 0)["loss"].backward()
    assert_same(grads_of(task), grads_of(reference), atol=1e-5)
    assert task.net[0].weight.grad.device == torch.device("cuda", 0)


def test_deterministic_runs_replicas_in_order_so_dropout_reproduces():
    class Dropping(MLP):
        def __init__(self):
            super().__init__()
            self.net[2].p = 0.5

    def run() -> tuple[dict[str, torch.Tensor], set[str]]:
        task = Dropping()
        trainer = Trainer(
            strategy="dp", devices=3, accelerator="cpu", max_epochs=1, deterministic=True, **QUIET
        )
        trainer.fit(task, DataLoader(make_data(), batch_size=9))
        return task.state_dict(), {name for _, name in task.seen}

    try:
        (first, threads), (second, _) = run(), run()
    finally:
        torch.use_deterministic_algorithms(False)
    assert threads == {threading.current_thread().name}  # the replicas ran one after another
    for k in first:
        assert torch.equal(first[k], second[k]), k
