"""autoencoder.py (DataModule with prepare_data/setup and save_hyperparameters, ModelCheckpoint on val_loss,
`AutoEncoder.load_from_checkpoint(path, lr=...)`, test and predict with the reloaded model) against a hand loop."""

from __future__ import annotations

import copy
import functools
import os

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset, random_split

from tests.ports.harness import QUIET, LazyPort, assert_same_weights, seed_all, weights

autoencoder = LazyPort("autoencoder")


def _splits() -> tuple[TensorDataset, TensorDataset, TensorDataset]:
    from sklearn.datasets import load_digits

    digits = load_digits()
    full = TensorDataset(torch.tensor(digits.data, dtype=torch.float32) / 16.0, torch.tensor(digits.target))
    trainval, test = random_split(full, [len(full) - 400, 400], generator=torch.Generator().manual_seed(42))
    train, val = random_split(
        trainval, [len(trainval) - 256, 256], generator=torch.Generator().manual_seed(42)
    )
    return train, val, test


def _mean_loss(net: torch.nn.Module, loader: DataLoader) -> float:
    """An epoch value of self.log in an evaluation step: the batch values averaged, weighted by batch size."""
    total, count = 0.0, 0
    with torch.no_grad():
        for x, _ in loader:
            total += float(F.mse_loss(net.decoder(net.encoder(x)), x)) * len(x)
            count += len(x)
    return total / count


@functools.cache  # computed once per session; the tests only read it
def reference() -> dict[str, object]:
    seed_all(7)
    train, val, test = _splits()
    net = autoencoder.AutoEncoder()  # as a plain nn.Module: layers only
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    train_loader = DataLoader(train, batch_size=64, shuffle=True)
    best_loss, best = float("inf"), None
    for _ in range(4):
        for x, _ in train_loader:
            loss = F.mse_loss(net.decoder(net.encoder(x)), x)
            opt.zero_grad()
            loss.backward()
            opt.step()
        val_loss = _mean_loss(net, DataLoader(val, batch_size=64))
        if val_loss < best_loss:  # ModelCheckpoint(mode="min") replaces the best only on a strict improvement
            best_loss, best = val_loss, copy.deepcopy(net)
    assert best is not None
    test_loader = DataLoader(test, batch_size=64)
    with torch.no_grad():
        embeddings = torch.cat([best.encoder(x) for x, _ in test_loader])
    return {
        "final": weights(net),
        "best": weights(best),
        "test_loss": _mean_loss(best, test_loader),
        "embeddings": embeddings,
    }


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("autoencoder")
    return autoencoder.main(data_dir=str(root / "data"), default_root_dir=str(root), **QUIET)


def test_autoencoder_fit_ends_with_the_hand_loops_weights(run):
    assert_same_weights(weights(run["model"]), reference()["final"])


def test_load_from_checkpoint_restores_the_best_weights_and_hparams_with_overrides(run):
    ref = reference()
    best = run["best"]
    assert type(best) is autoencoder.AutoEncoder and best is not run["model"]
    assert_same_weights(weights(best), ref["best"])
    assert dict(best.hparams) == {"hidden_dim": 32, "latent_dim": 6, "lr": 1e-4}  # lr overridden, rest saved
    assert os.path.isfile(run["trainer"].checkpoint_callback.best_model_path)


def test_test_and_predict_use_the_reloaded_model(run):
    ref = reference()
    assert run["results"] == [{"test_loss": pytest.approx(ref["test_loss"], rel=1e-5)}]
    torch.testing.assert_close(torch.cat(run["embeddings"]), ref["embeddings"], atol=1e-6, rtol=0)


def test_prepare_data_ran_and_the_data_module_kept_its_hyperparameters(run, tmp_path):
    assert os.path.isfile(os.path.join(os.path.dirname(run["trainer"].datamodule.data_file), "digits.pt"))
    dm = autoencoder.DigitsDataModule(data_dir=str(tmp_path), batch_size=32)
    assert dict(dm.hparams) == {"data_dir": str(tmp_path), "batch_size": 32, "val_size": 256}
    assert dm.hparams.batch_size == 32
