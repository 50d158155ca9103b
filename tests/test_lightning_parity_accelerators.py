"""Lightning's accelerator objects, compared with Lightning's on this machine: what each says the machine has,
the devices it parses, and ``Trainer(accelerator=CPUAccelerator())`` as the same run as ``accelerator="cpu"``."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from strategies.accelerators import CPUAccelerator, CUDAAccelerator, MPSAccelerator, XLAAccelerator
from tandem_core.errors import ConfigError
from trainer import Task, Trainer

pl = pytest.importorskip("pytorch_lightning")
QUIET = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)


@pytest.mark.parametrize("ours", [CPUAccelerator, CUDAAccelerator, MPSAccelerator, XLAAccelerator])
def test_availability_and_counts_are_lightnings(ours):
    theirs = getattr(pl.accelerators, ours.__name__)
    assert ours.is_available() == theirs.is_available()
    assert ours.auto_device_count() == theirs.auto_device_count()
    if ours is not XLAAccelerator:
        assert ours.name() == theirs.name()


def test_cpu_devices_parse_as_lightnings():
    for devices in (1, 2, "3"):
        assert CPUAccelerator.parse_devices(devices) == pl.accelerators.CPUAccelerator.parse_devices(devices)
        ours = CPUAccelerator.get_parallel_devices(CPUAccelerator.parse_devices(devices))
        assert ours == pl.accelerators.CPUAccelerator().get_parallel_devices(int(devices))


def test_an_accelerator_object_is_the_run_its_name_gives():
    class Tiny(Task):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Linear(2, 1)

        def training_step(self, batch, batch_idx):
            return self.net(batch[0]).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    weights = []
    for accelerator in ("cpu", CPUAccelerator(), CPUAccelerator):
        task = Tiny()
        data = DataLoader(
            TensorDataset(torch.randn(8, 2, generator=torch.Generator().manual_seed(1))), batch_size=4
        )
        Trainer(accelerator=accelerator, max_epochs=1, **QUIET).fit(task, data)
        weights.append(task.net.weight.detach().clone())
    assert torch.equal(weights[0], weights[1]) and torch.equal(weights[0], weights[2])


def test_xla_is_refused_with_the_reason():
    with pytest.raises(ConfigError, match="not supported by Tandem"):
        XLAAccelerator()
