"""Trainer(devices=...) in every form Lightning 2.x accepts, read against the devices this machine has.

Lightning's rules (lightning_fabric's device_parser and CPU accelerator), which Tandem follows:

- on the CPU, `devices` is a number of processes: an int > 0 or a string of digits ("2"); -1, "0,1" and
  index lists name GPUs and are refused there;
- on CUDA, an int n > 0 means GPUs 0..n-1, -1 (or "-1") every visible GPU, "0,1" or [0, 1] those GPU
  indices, "1" one GPU; 0, "0" and [] ask for none and are refused, as is an index the machine lacks.

Tandem puts rank i on cuda:i, so an index list must be 0..n-1 (any order); other indices are refused with
the CUDA_VISIBLE_DEVICES setting that selects them. Example::

    count("0,1", "cuda")  # 2 on a machine with two GPUs
"""

from __future__ import annotations

from typing import Any

import torch

from tandem_core.errors import ConfigError


def valid_form(devices: Any) -> bool:
    """Whether `devices` has one of Lightning's forms (what exists is checked by `count`)."""
    if isinstance(devices, bool):
        return False
    if isinstance(devices, int):
        return devices >= 1 or devices == -1
    if isinstance(devices, str):
        return devices == "auto" or _ids_from_text(devices) is not None
    if isinstance(devices, (list, tuple)):
        return bool(devices) and all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in devices
        )
    return False


def kind_of(accelerator: str) -> str:
    """'cpu', 'cuda' or 'mps': the accelerator a run uses ('auto' and 'gpu' resolved as Lightning does)."""
    backend = getattr(torch.backends, "mps", None)
    mps = backend is not None and backend.is_available()
    acc = {"gpu": "mps" if mps else "cuda"}.get(accelerator, accelerator)  # Lightning's "gpu": MPS on a Mac
    if acc != "auto":
        return acc
    if torch.cuda.is_available():
        return "cuda"
    return "mps" if mps else "cpu"


def count(devices: Any, accelerator: str = "auto") -> int | str:
    """The number of devices (processes for ddp) that `devices` asks for, or "auto"; a ConfigError saying
    what to write instead when this machine cannot run it."""
    if devices == "auto":
        return "auto"
    kind = kind_of(str(accelerator))
    if kind == "cpu":
        n = int(devices) if isinstance(devices, str) and devices.strip().isdigit() else devices
        if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
            raise ConfigError(
                f"devices={devices!r} on the CPU must be a number of processes > 0, e.g. devices=2 (as in "
                "Lightning: -1, '0,1' and index lists name GPUs, and none is in use here)"
            )
        return n
    ids = _ids(devices)
    available = torch.cuda.device_count() if kind == "cuda" else 1
    if ids == -1:
        ids = list(range(available))
    if not ids:
        raise ConfigError(
            f"devices={devices!r} asks for no {kind} device; give a count >= 1, or accelerator='cpu'"
        )
    if len(set(ids)) != len(ids):
        raise ConfigError(f"devices={devices!r} names a device twice; each index once")
    missing = [i for i in ids if i >= available]
    if missing:
        raise ConfigError(
            f"devices={devices!r} asks for {kind} device(s) {missing}, but this machine has "
            f"{available} (indices 0..{available - 1}); ask for at most {available}"
        )
    if sorted(ids) != list(range(len(ids))):
        visible = ",".join(str(i) for i in sorted(ids))
        raise ConfigError(
            f"devices={devices!r}: Tandem puts rank i on {kind}:i, so indices must be 0..n-1; to run on "
            f"GPUs {visible}, start with CUDA_VISIBLE_DEVICES={visible} and devices={len(ids)}"
        )
    return len(ids)


def _ids(devices: Any) -> int | list[int]:
    """-1 (every device) or the device indices `devices` names (Lightning's parsing)."""
    if isinstance(devices, str):
        parsed = _ids_from_text(devices)
        if parsed is None:
            raise ConfigError(f"devices={devices!r} must be 'auto', a count, '-1' or indices like '0,1'")
        return parsed
    if isinstance(devices, (list, tuple)):
        return list(devices)
    return -1 if devices == -1 else list(range(devices))


def _ids_from_text(text: str) -> int | list[int] | None:
    """'-1' -> -1, '0,1' -> [0, 1], '2' -> [0, 1] (a count), None when it is none of those."""
    s = text.strip()
    if s == "-1":
        return -1
    parts = [p.strip() for p in s.split(",") if p.strip()]
    if not parts or not all(p.isdigit() for p in parts):
        return None
    return [int(p) for p in parts] if "," in s else list(range(int(s)))
