"""sensors.py (prepare_data/setup/dataloaders on the task, a custom batch class, on_before_batch_transfer,
transfer_batch_to_device, on_after_batch_transfer, training_step returning None) against a hand loop."""

from __future__ import annotations

import functools
import os

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from tests.ports.harness import QUIET, LazyPort, assert_same_weights, seed_all, weights

sensors = LazyPort("sensors")

EPOCHS = 3


@functools.cache  # computed once per session; the tests only read it
def reference(skip_none: bool = True) -> dict[str, torch.Tensor]:
    """Per training batch, as Lightning orders it: on_before_batch_transfer (host jitter, one draw from the
    global RNG), the transfer, on_after_batch_transfer (standardise), then training_step; a None loss means
    no backward and no parameter update. Validation batches are not jittered."""
    seed_all(5)
    data = sensors.generate_recordings()
    readings, target = data["readings"], data["target"]
    net = sensors.SensorRegressor()  # as a plain nn.Module: its layers only
    scaled = readings[: sensors.N_TRAIN].float() / 255
    mean, std = scaled.mean(0), scaled.std(0)
    net.mean.copy_(mean)
    net.std.copy_(std)
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    train = DataLoader(TensorDataset(readings[: sensors.N_TRAIN], target[: sensors.N_TRAIN]), batch_size=32)
    val = DataLoader(TensorDataset(readings[sensors.N_TRAIN :], target[sensors.N_TRAIN :]), batch_size=32)
    for _ in range(EPOCHS):
        for raw, y in train:
            noise = torch.randint(-2, 3, raw.shape, dtype=torch.int16)
            x = ((raw.to(torch.int16) + noise).clamp(0, 255).to(torch.uint8).float() / 255 - mean) / std
            if skip_none and torch.isnan(y).any():
                continue
            loss = F.mse_loss(net.net(x).squeeze(1), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            for _ in val:  # validation at the epoch's end: only its loader's draw touches the global RNG
                pass
    return weights(net)


def test_sensor_script_ends_with_the_hand_loops_weights(tmp_path):
    out = sensors.main(data_dir=str(tmp_path / "data"), default_root_dir=str(tmp_path), **QUIET)
    assert os.path.isfile(tmp_path / "data" / "recordings.pt")  # the task's prepare_data ran
    assert_same_weights(weights(out["model"]), reference())
    assert torch.isfinite(out["trainer"].callback_metrics["val_loss"])


class Recording:
    """Mixed into the script's task (at test time): records the transfers and checks the batch types."""

    def __init__(self, data_dir: str) -> None:
        super().__init__(data_dir=data_dir)
        self.transfers: list[tuple[bool, str, int]] = []
        self.steps: list[int] = []

    def transfer_batch_to_device(self, batch, device, dataloader_idx):
        self.transfers.append((self.trainer.training, str(device), dataloader_idx))
        return super().transfer_batch_to_device(batch, device, dataloader_idx)

    def on_after_batch_transfer(self, batch, dataloader_idx):
        assert batch.readings.dtype == torch.uint8  # the transfer hook ran first, on the raw batch
        return super().on_after_batch_transfer(batch, dataloader_idx)

    def training_step(self, batch, batch_idx):
        assert batch.readings.dtype == torch.float32  # standardised by on_after_batch_transfer
        self.steps.append(batch_idx)
        return super().training_step(batch, batch_idx)


def test_transfer_hooks_run_for_every_batch_in_order(tmp_path):
    task = type("RecordingSensors", (Recording, sensors.SensorRegressor), {})(str(tmp_path / "data"))
    sensors.Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                    num_sanity_val_steps=0, **QUIET).fit(task)  # fmt: skip
    device = str(task.device)
    assert task.transfers == [(True, device, 0)] * 16 + [(False, device, 0)] * 4
    assert task.steps == list(range(16))


def test_skipping_a_batch_changes_the_result():
    # returning None must skip the update: a loop that stepped on the NaN batches would end elsewhere (NaN)
    skipped = reference()
    assert all(torch.isfinite(v).all() for v in skipped.values())
    with pytest.raises(AssertionError):
        assert_same_weights(reference(skip_none=False), skipped)
