"""Throughput's rolling rates against arithmetic by hand, measure_flops against the FLOPs of a matmul, and
ThroughputMonitor's logged keys."""

from __future__ import annotations

import pytest
import torch
from callback_tasks import Scored, loader
from conftest import FAST
from test_device_stats import Recording

from callbacks import ThroughputMonitor
from callbacks.throughput.meter import Throughput, get_available_flops, measure_flops
from trainer import Trainer


def test_rates_over_the_window():
    tp = Throughput(available_flops=100.0, world_size=2, window_size=3)
    for i in range(1, 5):  # one batch of 4 samples (10 items, 50 FLOPs) per 0.5 s
        tp.update(time=0.5 * i, batches=i, samples=4 * i, lengths=10 * i, flops=50)
    out = tp.compute()
    assert out["time"] == 2.0 and out["batches"] == 4 and out["samples"] == 16 and out["lengths"] == 40
    assert out["device/batches_per_sec"] == pytest.approx(2.0) and out["batches_per_sec"] == pytest.approx(
        4.0
    )
    assert out["device/samples_per_sec"] == pytest.approx(8.0) and out[
        "device/items_per_sec"
    ] == pytest.approx(20.0)
    assert out["device/flops_per_sec"] == pytest.approx(100.0) and out["device/mfu"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="increase"):
        tp.update(time=0.1, batches=5, samples=20)


def test_measure_flops_counts_a_linear_layer():
    model = torch.nn.Linear(8, 4, bias=False)
    x = torch.randn(16, 8)
    assert measure_flops(model, lambda: model(x)) == 2 * 16 * 8 * 4
    assert (
        measure_flops(model, lambda: model(x), lambda y: y.sum()) == 2 * 2 * 16 * 8 * 4
    )  # + the weight grad
    assert get_available_flops(torch.device("cpu"), torch.float32) is None


def test_monitor_logs_train_and_validation_rates(tmp_path):
    logger = Recording(str(tmp_path))
    cb = ThroughputMonitor(batch_size_fn=lambda b: b[0].shape[0], window_size=2)
    with pytest.warns(UserWarning, match="flops_per_batch"):
        Trainer(max_epochs=2, callbacks=[cb], **{**FAST, "logger": logger, "log_every_n_steps": 1}).fit(
            Scored(), loader(8, 2), loader(4, 2)
        )
    keys = {k for _, m in logger.logged for k in m}
    assert {"train/samples", "train/device/samples_per_sec", "validate/batches", "train/time"} <= keys
    last = [m for _, m in logger.logged if "train/samples" in m][-1]
    assert last["train/samples"] == 16 and last["train/batches"] == 8
