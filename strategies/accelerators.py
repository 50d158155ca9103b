"""Lightning's accelerator objects (``CPUAccelerator``, ``CUDAAccelerator``, ``MPSAccelerator``), for code written
against them: ``CUDAAccelerator.is_available()``, ``auto_device_count()``, ``Trainer(accelerator=CPUAccelerator())``.

In Tandem the strategy places the task and its batches (``Strategy.root_device``); an accelerator object only
names the kind of device and answers what the machine has. ``Trainer(accelerator=X())`` is the same run as
``Trainer(accelerator=X.name())``. XLA (TPUs) is not supported: ``XLAAccelerator.is_available()`` is False and
building one is a ConfigError.
"""

from __future__ import annotations

from typing import Any

import torch

from tandem_core.errors import ConfigError

__all__ = ["Accelerator", "CPUAccelerator", "CUDAAccelerator", "MPSAccelerator", "XLAAccelerator"]


class Accelerator:
    """The kind of device a run uses. Subclasses answer for one kind."""

    @classmethod
    def name(cls) -> str:
        """The accelerator's name as ``Trainer(accelerator=...)`` takes it."""
        raise NotImplementedError

    @staticmethod
    def is_available() -> bool:
        """Whether this machine has a device of this kind."""
        raise NotImplementedError

    @staticmethod
    def auto_device_count() -> int:
        """The number of devices ``devices="auto"`` uses."""
        raise NotImplementedError

    @classmethod
    def parse_devices(cls, devices: Any) -> Any:
        """The devices a ``devices`` value asks for: a count on the CPU, device indices on a GPU."""
        if isinstance(devices, str) and devices.strip().lstrip("-").isdigit():
            devices = int(devices)
        if devices == -1:
            return list(range(cls.auto_device_count()))
        if isinstance(devices, int) and cls.name() != "cpu":
            return list(range(devices))
        return devices

    @classmethod
    def get_parallel_devices(cls, devices: Any) -> list[torch.device]:
        """One torch.device per process for the parsed `devices`."""
        parsed = cls.parse_devices(devices)
        ids = parsed if isinstance(parsed, list) else list(range(int(parsed)))
        return [torch.device(cls.name()) if cls.name() == "cpu" else torch.device(cls.name(), i) for i in ids]

    def setup_device(self, device: torch.device) -> None:
        """Make `device` this process's current device (a GPU's index; nothing on the CPU)."""
        if device.type == "cuda":
            torch.cuda.set_device(device)

    def teardown(self) -> None:
        """Release what the accelerator holds (nothing: the strategy owns the run's resources)."""

    def get_device_stats(self, device: Any) -> dict[str, Any]:
        """Statistics of `device` (what DeviceStatsMonitor logs): CUDA's allocator, MPS's, psutil's on the CPU."""
        return device_stats(torch.device(device))


class CPUAccelerator(Accelerator):
    """The CPU: always available; ``devices`` counts processes."""

    @classmethod
    def name(cls) -> str:
        return "cpu"

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def auto_device_count() -> int:
        return 1

    def get_device_stats(self, device: Any = None) -> dict[str, Any]:
        """psutil's memory, CPU and swap use of this machine (whatever `device` says)."""
        return cpu_stats()


class CUDAAccelerator(Accelerator):
    """NVIDIA GPUs through CUDA."""

    @classmethod
    def name(cls) -> str:
        return "cuda"

    @staticmethod
    def is_available() -> bool:
        return torch.cuda.is_available()

    @staticmethod
    def auto_device_count() -> int:
        return torch.cuda.device_count()


class MPSAccelerator(Accelerator):
    """Apple silicon GPUs through MPS."""

    @classmethod
    def name(cls) -> str:
        return "mps"

    @staticmethod
    def is_available() -> bool:
        mps = getattr(torch.backends, "mps", None)
        return bool(mps is not None and mps.is_available())

    @staticmethod
    def auto_device_count() -> int:
        return 1


class XLAAccelerator(Accelerator):
    """TPUs through torch_xla: not supported by Tandem (never available; building one is refused)."""

    def __init__(self) -> None:
        raise ConfigError(
            "XLAAccelerator (TPUs) is not supported by Tandem; use CUDAAccelerator or CPUAccelerator"
        )

    @classmethod
    def name(cls) -> str:
        return "tpu"

    @staticmethod
    def is_available() -> bool:
        return False

    @staticmethod
    def auto_device_count() -> int:
        return 0


def cpu_stats() -> dict[str, float]:
    """psutil's view of the machine: memory, CPU and swap use in percent."""
    import psutil

    return {
        "cpu_vm_percent": psutil.virtual_memory().percent,
        "cpu_percent": psutil.cpu_percent(),
        "cpu_swap_percent": psutil.swap_memory().percent,
    }


def device_stats(device: torch.device) -> dict[str, Any]:
    """torch.cuda.memory_stats on a GPU (allocated, reserved, peaks, ...), psutil's figures on the CPU."""
    if device.type == "cuda":
        return dict(torch.cuda.memory_stats(device))
    if device.type == "mps":
        return {"mps.current_allocated_bytes": torch.mps.current_allocated_memory()}
    return cpu_stats()


def for_device(device: torch.device) -> Accelerator:
    """The Accelerator object of a device's kind (``trainer.accelerator``)."""
    kinds: dict[str, type[Accelerator]] = {"cuda": CUDAAccelerator, "mps": MPSAccelerator}
    return kinds.get(device.type, CPUAccelerator)()


def by_name(accelerator: Any) -> Any:
    """``Trainer(accelerator=...)``: an Accelerator object (class or instance) as its name; anything else as given."""
    if isinstance(accelerator, Accelerator) or (
        isinstance(accelerator, type) and issubclass(accelerator, Accelerator)
    ):
        return accelerator.name()
    return accelerator
