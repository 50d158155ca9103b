"""Trainer(devices=...) in Lightning's forms, compared with Lightning 2.6's own parsing of the same values."""

from __future__ import annotations

import pytest
import torch

from tandem_core.errors import ConfigError
from trainer import Trainer
from trainer.devices import count, valid_form

pl = pytest.importorskip("pytorch_lightning")

FORMS = ["auto", 1, "1", 2, "2", 3, -1, "-1", "0,1", "1,0", [0], [0, 1], [1], (0, 1), "0", 0, [], [0, 0]]


def lightning_cpu(devices):
    """What Lightning 2.6 makes of `devices` on the CPU: a number of processes, or None when it refuses."""
    from pytorch_lightning.accelerators import CPUAccelerator

    if devices in ([], 0, "0"):  # the connector refuses these before the accelerator parses
        return None
    if devices == "auto":
        return 1
    try:
        return CPUAccelerator.parse_devices(devices)
    except (TypeError, ValueError, pl.utilities.exceptions.MisconfigurationException):
        return None


def lightning_cuda(devices, monkeypatch, n_gpus):
    """What Lightning 2.6 makes of `devices` on a machine with `n_gpus` CUDA devices: the GPU indices or None."""
    import lightning_fabric.accelerators.cuda as fabric_cuda
    from lightning_fabric.utilities.device_parser import _parse_gpu_ids

    monkeypatch.setattr(fabric_cuda, "num_cuda_devices", lambda: n_gpus)
    if devices in ([], 0, "0"):
        return None
    try:
        ids = _parse_gpu_ids(devices, include_cuda=True)
    except (TypeError, ValueError, pl.utilities.exceptions.MisconfigurationException):
        return None
    return ids or None


def tandem(devices, accelerator):
    if not valid_form(devices):
        return None
    try:
        return count(devices, accelerator)
    except ConfigError:
        return None


@pytest.mark.parametrize("devices", FORMS, ids=repr)
def test_cpu_forms_match_lightning(devices):
    expected = lightning_cpu(devices)
    got = tandem(devices, "cpu")
    assert got == (expected if devices != "auto" else "auto"), (devices, expected, got)


@pytest.mark.parametrize("devices", [d for d in FORMS if d != "auto"], ids=repr)
def test_cuda_forms_match_lightning_on_a_two_gpu_machine(devices, monkeypatch):
    ids = lightning_cuda(devices, monkeypatch, 2)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    got = tandem(devices, "cuda")
    if ids is None:
        assert got is None, devices
    elif sorted(ids) == list(range(len(ids))):
        assert got == len(ids), (devices, ids)
    else:  # Lightning runs on those indices; Tandem puts rank i on cuda:i, and refuses rather than move them
        assert got is None, (devices, ids)
        with pytest.raises(ConfigError, match="CUDA_VISIBLE_DEVICES=1 and devices=1"):
            count(devices, "cuda")


def test_refusals_say_what_to_write():
    with pytest.raises(ConfigError, match=r"on the CPU must be a number of processes > 0, e.g. devices=2"):
        Trainer(devices=[0, 1], accelerator="cpu", logger=False)
    with pytest.raises(ConfigError, match="must be an int >= 1, -1, 'auto'"):
        Trainer(devices=0, accelerator="cpu", logger=False)
    if not torch.cuda.is_available():
        assert Trainer(devices="2", accelerator="cpu", strategy="ddp", logger=False).strategy.devices == 2


def test_more_gpus_than_the_machine_has_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ConfigError, match=r"asks for cuda device\(s\) \[1\], but this machine has 1"):
        count("0,1", "cuda")
    assert count(-1, "cuda") == 1 and count([0], "cuda") == 1


def test_a_config_gives_a_strategy_entry_the_count(tmp_path):
    import trainer.config as C

    if torch.cuda.is_available():
        pytest.skip("the CPU's rule is checked here")
    raw = {"trainer": {"devices": "2", "accelerator": "cpu", "logger": False, "default_root_dir": str(tmp_path),
                       "strategy": {"_target_": "strategies.ddp.DDPStrategy"}}}  # fmt: skip
    trainer = C.build_trainer(raw)
    assert trainer.strategy.devices == 2 and trainer.config.devices == 2
