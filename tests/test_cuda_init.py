"""CUDA stays uninitialized in the parent until a stage runs (issue 41, finding 4): Trainer() asks whether there
is a GPU through NVML only, and ddp_fork / ddp_notebook refuse a parent that initialized CUDA before any worker
is forked. On this CPU machine torch's CUDA entry points are made observable: a fake NVML count of GPUs, and a
recorder on the calls that would initialize CUDA (the CUDA runtime's device count, torch's lazy init)."""

from __future__ import annotations

import multiprocessing.process
import os
import subprocess
import sys

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from tandem_core.errors import ConfigError
from tests.conftest import FAST
from trainer import Task, Trainer


class Tiny(Task):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


@pytest.fixture
def cuda_calls(monkeypatch):
    """A machine that NVML says has 2 GPUs; the list of calls that would initialize CUDA."""
    calls: list[str] = []

    def runtime_count() -> int:
        calls.append("cudaGetDeviceCount")
        return 2

    def lazy_init() -> None:
        calls.append("torch.cuda._lazy_init")
        raise AssertionError("CUDA initialized")

    monkeypatch.setattr(torch.cuda, "_is_compiled", lambda: True)
    monkeypatch.setattr(torch.cuda, "_device_count_nvml", lambda: 2)
    monkeypatch.setattr(torch._C, "_cuda_getDeviceCount", runtime_count, raising=False)
    monkeypatch.setattr(torch.cuda, "_lazy_init", lazy_init)
    return calls


def test_importing_tandem_asks_torch_for_nvml_based_cuda_checks():
    code = "import os, trainer; print(os.environ.get('PYTORCH_NVML_BASED_CUDA_CHECK'))"
    env = {k: v for k, v in os.environ.items() if k != "PYTORCH_NVML_BASED_CUDA_CHECK"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "1"
    env["PYTORCH_NVML_BASED_CUDA_CHECK"] = "0"  # the user's own choice is kept
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "0"


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(accelerator="auto"),
        dict(accelerator="gpu", devices=2, strategy="ddp_notebook"),
        dict(accelerator="cuda", devices=2, strategy="ddp_fork", precision="bf16-mixed"),
        dict(accelerator="cuda", devices=2, strategy="ddp"),
    ],
)
def test_trainer_does_not_initialize_cuda(cuda_calls, monkeypatch, kwargs):
    monkeypatch.setenv("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    assert torch.cuda.is_available() and torch.cuda.device_count() == 2  # what the fake machine says
    trainer = Trainer(logger=False, enable_checkpointing=False, **kwargs)
    assert trainer.strategy.root_device.type == "cuda"
    assert cuda_calls == []
    # the check the fix relies on: without NVML, is_available() itself initializes CUDA (the runtime's count)
    monkeypatch.setenv("PYTORCH_NVML_BASED_CUDA_CHECK", "0")
    torch.cuda.is_available()
    assert cuda_calls == ["cudaGetDeviceCount"]


@pytest.mark.parametrize("strategy", ["ddp_fork", "ddp_notebook"])
def test_fork_refuses_a_parent_that_initialized_cuda_before_any_worker_starts(monkeypatch, strategy):
    started: list[object] = []
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", lambda self: started.append(self))
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    available: list[bool] = []  # the check must not ask is_available() (it would initialize CUDA itself)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: available.append(True) or False)
    trainer = Trainer(strategy=strategy, devices=2, max_steps=1, **FAST)
    available.clear()  # (the Trainer's own device resolution may ask)
    data = DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=2)
    with pytest.raises(
        ConfigError, match="CUDA was initialized in this process before the workers were forked"
    ):
        trainer.fit(Tiny(), data)
    assert started == [] and available == []
