"""Logged values as Python floats, read from the device in as few copies as possible."""

from __future__ import annotations

from typing import Any

import torch


def to_floats(metrics: dict[str, Any]) -> dict[str, float]:
    """Convert tensors to floats with one device-to-host copy per device instead of one per value."""
    out: dict[str, float] = {}
    by_device: dict[torch.device, list[str]] = {}
    for k, v in metrics.items():
        if isinstance(v, torch.Tensor) and v.numel() == 1:
            by_device.setdefault(v.device, []).append(k)
        else:
            out[k] = float(v)
    for keys in by_device.values():
        if len(keys) == 1:
            out[keys[0]] = metrics[keys[0]].item()
        else:
            stacked = torch.stack([metrics[k].detach().reshape(()).double() for k in keys])
            out.update(zip(keys, stacked.tolist()))
    return {k: out[k] for k in metrics}
