"""curriculum.py (reload_dataloaders_every_n_epochs, use_distributed_sampler=False, devices="auto", two loggers
used through self.logger/self.loggers, profiler="simple", detect_anomaly, inference_mode=False,
overfit_batches) against a hand loop."""

from __future__ import annotations

import csv
import functools
import os

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, RandomSampler, SequentialSampler, TensorDataset

from callbacks import Callback
from tests.ports.harness import QUIET, LazyPort, assert_same_weights, seed_all, weights

curriculum = LazyPort("curriculum")

EPOCHS = 5


@functools.cache  # computed once per session; the tests only read it
def reference(overfit_batches: int = 0) -> dict[str, object]:
    """The training loader is built by the task's train_dataloader at epochs 0, 2, 4 (current_epoch then
    decides the classes). With overfit_batches=n Lightning swaps a shuffling sampler for a sequential one and
    uses n batches of training and of validation per epoch."""
    seed_all(13)
    x, y = curriculum.load_digits_tensors()
    net = curriculum.CurriculumClassifier()  # as a plain nn.Module
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    val = DataLoader(TensorDataset(x[1280:], y[1280:]), batch_size=128)
    loader, classes = None, []
    for epoch in range(EPOCHS):
        if epoch % 2 == 0:
            keep = y[:1280] < curriculum.classes_at(epoch, 2)
            ds = TensorDataset(x[:1280][keep], y[:1280][keep])
            g = torch.Generator().manual_seed(13 + epoch)
            sampler = SequentialSampler(ds) if overfit_batches else RandomSampler(ds, generator=g)
            loader = DataLoader(ds, batch_size=64, sampler=sampler)
        classes.append(curriculum.classes_at(epoch, 2))
        for i, (xb, yb) in enumerate(loader):
            if overfit_batches and i == overfit_batches:
                break
            loss = F.cross_entropy(net(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            for i, (xb, _) in enumerate(val):
                if overfit_batches and i == overfit_batches:
                    break
                net(xb)
    saliency = []
    for xb, _ in DataLoader(TensorDataset(x[1280:1312], y[1280:1312]), batch_size=16):
        xb = xb.clone().requires_grad_(True)
        (grad,) = torch.autograd.grad(net(xb).max(dim=1).values.sum(), xb)
        saliency.append(grad.abs())
    return {"weights": weights(net), "classes": classes, "saliency": saliency}


class AnomalyMode(Callback):
    def __init__(self) -> None:
        self.seen: set[bool] = set()

    def on_train_batch_start(self, trainer, task, batch, batch_idx):
        self.seen.add(torch.is_anomaly_enabled())


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("curriculum")
    anomaly = AnomalyMode()
    out = curriculum.main(save_dir=str(root), default_root_dir=str(root), callbacks=[anomaly], **QUIET)
    out["anomaly"] = anomaly.seen
    return out


def test_curriculum_ends_with_the_hand_loops_weights_and_saliency(run):
    ref = reference()
    assert_same_weights(weights(run["model"]), ref["weights"])
    assert len(run["saliency"]) == 2
    for got, want in zip(run["saliency"], ref["saliency"]):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0)


def test_both_loggers_got_what_the_task_sent_them(run):
    trainer = run["trainer"]
    tb, csv_logger = trainer.loggers
    assert trainer.logger is tb and isinstance(csv_logger, curriculum.CSVLogger)
    with open(os.path.join(csv_logger.log_dir, "metrics.csv")) as f:
        rows = list(csv.DictReader(f))
    classes = [int(float(r["curriculum/classes"])) for r in rows if r.get("curriculum/classes")]
    assert classes == reference()["classes"] == [4, 4, 7, 7, 10]
    assert any(r.get("val_acc") for r in rows)
    assert any(name.startswith("events.out.tfevents") for name in os.listdir(tb.log_dir))
    # save_hyperparameters() (logger=True): the hyperparameters reach the logger
    with open(os.path.join(csv_logger.log_dir, "hparams.yaml")) as f:
        assert "stage_epochs" in f.read()


def test_profiler_and_anomaly_detection(run):
    assert "training_step" in run["trainer"].profiler.summary()
    assert run["anomaly"] == {True}  # the training loop ran under torch.autograd.detect_anomaly
    assert not torch.is_anomaly_enabled()  # and it was switched off again afterwards


def test_overfit_batches_uses_the_first_batches_in_order(tmp_path):
    out = curriculum.main(save_dir=str(tmp_path), default_root_dir=str(tmp_path), overfit_batches=2, **QUIET)
    assert_same_weights(weights(out["model"]), reference(overfit_batches=2)["weights"])
    assert out["trainer"].global_step == 2 * EPOCHS
