"""mc_dropout.py (configure_model, on_validation_model_eval/train, on_predict_model_eval, validate/test/predict
with model= and verbose=False) against a hand loop. Validation with dropout active draws from the global RNG,
so a Trainer that skipped on_validation_model_eval would also train differently afterwards."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from tests.ports.harness import QUIET, LazyPort, assert_same_weights, differs, seed_all, weights

mc_dropout = LazyPort("mc_dropout")


def _val_mse(model: mc_dropout.MCDropoutRegressor, loader: DataLoader, mc: bool) -> float:
    """The epoch value of the logged MSE (batch values averaged, weighted by batch size)."""
    model.eval()
    if mc:
        mc_dropout.enable_dropout(model)
    total, count = 0.0, 0
    with torch.no_grad():
        for x, y in loader:
            pred = model.mc_predict(x)[0] if mc else model(x)
            total += float(F.mse_loss(pred, y)) * len(y)
            count += len(y)
    model.train()
    return total / count


@functools.cache  # computed once per session; the tests only read it
def reference(mc_validation: bool = True) -> dict[str, object]:
    seed_all(21)
    train = DataLoader(mc_dropout.noisy_sine(256, seed=0), batch_size=32, shuffle=True)
    val = DataLoader(mc_dropout.noisy_sine(64, seed=1), batch_size=32)
    model = mc_dropout.MCDropoutRegressor()
    model.configure_model()  # Lightning builds the layers at the start of fit; nothing draws randomness before
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(4):
        model.train()
        for x, y in train:
            loss = F.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        _val_mse(model, val, mc=mc_validation)
    out: dict[str, object] = {"weights": weights(model)}
    out["val"] = _val_mse(model, val, mc=True)
    out["test"] = _val_mse(model, val, mc=False)
    model.eval()
    mc_dropout.enable_dropout(model)
    with torch.no_grad():
        out["predictions"] = [
            model.mc_predict(x) for x, _ in DataLoader(mc_dropout.noisy_sine(16, seed=2), batch_size=8)
        ]
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return mc_dropout.main(default_root_dir=str(tmp_path_factory.mktemp("mc")), **QUIET)


def test_mc_dropout_fit_ends_with_the_hand_loops_weights(run):
    assert_same_weights(weights(run["model"]), reference()["weights"])


def test_validate_test_and_predict_with_model_keyword(run):
    ref = reference()
    assert run["val"] == [{"val_mse": pytest.approx(ref["val"], abs=1e-6)}]
    assert run["test"] == [{"test_mse": pytest.approx(ref["test"], abs=1e-6)}]
    assert len(run["predictions"]) == len(ref["predictions"]) == 2
    for (mean, std), (ref_mean, ref_std) in zip(run["predictions"], ref["predictions"]):
        torch.testing.assert_close(mean, ref_mean, atol=1e-6, rtol=0)
        torch.testing.assert_close(std, ref_std, atol=1e-6, rtol=0)
    assert float(run["predictions"][0][1].min()) > 0  # dropout really was active while predicting


def test_the_validation_hooks_matter_for_this_script():
    assert differs(reference(mc_validation=True)["weights"], reference(mc_validation=False)["weights"])


class InferenceModes:
    """Mixed into the script's task (at test time): records whether each step ran under torch.inference_mode."""

    def __init__(self) -> None:
        super().__init__()
        self.modes: dict[str, set[bool]] = {}
        self.fitting = False

    def on_fit_start(self):
        self.fitting = True

    def on_fit_end(self):
        self.fitting = False

    def _note(self, where: str) -> None:
        self.modes.setdefault(where, set()).add(torch.is_inference_mode_enabled())

    def validation_step(self, batch, batch_idx):
        self._note("fit" if self.fitting else "validate")
        return super().validation_step(batch, batch_idx)

    def test_step(self, batch, batch_idx):
        self._note("test")
        return super().test_step(batch, batch_idx)

    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        self._note("predict")
        return super().predict_step(batch, batch_idx, dataloader_idx)


def test_inference_mode_is_used_outside_fit_by_default(tmp_path):
    task = type("Modes", (InferenceModes, mc_dropout.MCDropoutRegressor), {})()
    loader = DataLoader(mc_dropout.noisy_sine(32, seed=1), batch_size=16)
    trainer = mc_dropout.Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                                 default_root_dir=str(tmp_path), **QUIET)  # fmt: skip
    trainer.fit(task, loader, loader)
    trainer.validate(task, loader, verbose=False)
    trainer.test(task, loader, verbose=False)
    trainer.predict(task, loader)
    # Trainer(inference_mode=True), the default: standalone evaluation runs under torch.inference_mode;
    # validation inside fit runs under torch.no_grad (its tensors may meet training's later)
    assert task.modes == {"fit": {False}, "validate": {True}, "test": {True}, "predict": {True}}
