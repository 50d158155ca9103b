"""template.py (injected net and optimizer partials, save_hyperparameters(logger=False, ignore=[...]),
torchmetrics objects logged with self.log, ReduceLROnPlateau on val/loss, ModelCheckpoint on val/acc with a
format-spec filename, test(ckpt_path="best", verbose=False)) against a hand loop."""

from __future__ import annotations

import copy
import glob
import os

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset, random_split

from tests.ports.harness import FitEndWeights, LazyPort, assert_same_weights, seed_all, weights

template = LazyPort("template")

EPOCHS = 5


def _evaluate(net: torch.nn.Module, loader: DataLoader) -> tuple[float, float]:
    """MeanMetric of the batch losses (each batch weighs 1) and the accuracy over every sample."""
    net.eval()
    losses, correct, total = [], 0, 0
    with torch.no_grad():
        for x, y in loader:
            logits = net(x)
            losses.append(float(F.cross_entropy(logits, y)))
            correct += int((logits.argmax(1) == y).sum())
            total += len(y)
    net.train()
    return sum(losses) / len(losses), correct / total


def reference() -> dict[str, object]:
    seed_all(12345)
    from sklearn.datasets import load_digits

    digits = load_digits()
    data = TensorDataset(torch.tensor(digits.data, dtype=torch.float32) / 16.0, torch.tensor(digits.target))
    train, val, test = random_split(data, (1197, 300, 300), generator=torch.Generator().manual_seed(42))
    net = template.SimpleDenseNet()
    opt = torch.optim.Adam(net.parameters(), lr=0.01, weight_decay=0.0)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(
        opt, mode="min", factor=0.5, patience=0, threshold=0.3
    )
    train_loader = DataLoader(train, batch_size=64, shuffle=True)
    best_acc, best_epoch, best, accs, lrs = -1.0, -1, None, [], []
    for epoch in range(EPOCHS):
        for x, y in train_loader:
            loss = F.cross_entropy(net(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        val_loss, val_acc = _evaluate(net, DataLoader(val, batch_size=64))
        accs.append(val_acc)
        if val_acc > best_acc:  # ModelCheckpoint(mode="max"): a strictly better value replaces the best
            best_acc, best_epoch, best = val_acc, epoch, copy.deepcopy(net)
        plateau.step(val_loss)  # monitor "val/loss", interval "epoch": after the epoch's validation
        lrs.append(opt.param_groups[0]["lr"])
    test_loss, test_acc = _evaluate(best, DataLoader(test, batch_size=64))
    return {"final": weights(net), "best_epoch": best_epoch, "accs": accs, "lrs": lrs,
            "test": {"test/loss": test_loss, "test/acc": test_acc}}  # fmt: skip


@pytest.fixture(scope="module")
def ref():
    return reference()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    snapshot = FitEndWeights()
    out = template.main(default_root_dir=str(tmp_path_factory.mktemp("template")), callbacks=[snapshot],
                        enable_model_summary=False)  # fmt: skip
    out["fit_weights"] = snapshot.state
    return out


def test_template_fit_ends_with_the_hand_loops_weights(run, ref):
    assert_same_weights({k[len("net.") :]: v for k, v in run["fit_weights"].items()}, ref["final"])
    assert ref["lrs"][-1] < 0.01  # the plateau scheduler acted, so a Trainer that skipped it would differ


def test_test_with_ckpt_path_best_reports_the_best_epochs_metrics(run, ref):
    expected = {k: pytest.approx(v, abs=1e-6) for k, v in ref["test"].items()}
    assert run["test_results"] == [expected]
    assert run["test_metrics"] == expected  # callback_metrics after test hold the test's keys only
    assert os.path.basename(run["ckpt_path"]) == f"epoch_{ref['best_epoch']:03d}.ckpt"  # "epoch_{epoch:03d}"
    assert os.path.basename(run["trainer"].checkpoint_callback.last_model_path) == "last.ckpt"


def test_torchmetrics_objects_are_logged_as_their_epoch_values(run, ref):
    metrics = run["train_metrics"]
    assert float(metrics["val/acc"]) == pytest.approx(ref["accs"][-1], abs=1e-6)
    assert float(metrics["val/acc_best"]) == pytest.approx(max(ref["accs"]), abs=1e-6)
    assert {"train/loss", "train/acc", "val/loss"} <= set(metrics)


def test_hyperparameters_ignore_the_network_and_stay_out_of_the_logger(run):
    model, trainer = run["model"], run["trainer"]
    assert set(model.hparams) == {"optimizer", "scheduler", "compile"}  # ignore=["net"]
    assert model.hparams.compile is False
    assert set(trainer.datamodule.hparams) == {
        "train_val_test_split",
        "batch_size",
        "num_workers",
        "pin_memory",
    }
    # save_hyperparameters(logger=False) on both: the CSV logger's hparams.yaml holds none of them
    files = glob.glob(os.path.join(trainer.logger.log_dir, "hparams.yaml"))
    text = "".join(open(f).read() for f in files)
    assert "optimizer" not in text and "batch_size" not in text
    assert os.path.isfile(os.path.join(trainer.logger.log_dir, "metrics.csv"))
