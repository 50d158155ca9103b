"""Moving a batch to the device, through the batch-transfer hooks of the DataModule or the task where one
overrides them (the DataModule's first, as in Lightning)."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

from tandem_core.hooks import overrides, replaces_default
from trainer.loop.hooks import run_as

if TYPE_CHECKING:
    from trainer.trainer import Trainer

TRANSFER = ("on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer")


def transfer_owners(task: Any, dm: Any) -> dict[str, Any]:
    """Who runs each overridden transfer hook: the DataModule where it overrides it (Lightning warns when
    both do and uses the DataModule's), else the task."""
    owners = {}
    for name in TRANSFER:
        if dm is not None and replaces_default(dm, name):
            if task is not None and replaces_default(task, name):
                warnings.warn(
                    f"{name} is overridden in both {type(task).__name__} and {type(dm).__name__}; the "
                    f"DataModule's runs (as in Lightning).",
                    UserWarning,
                    stacklevel=3,
                )
            owners[name] = dm
        elif task is not None and overrides(task, name):
            owners[name] = task
    return owners


def to_device(t: Trainer, batch: Any, dataloader_idx: int = 0) -> Any:
    """on_before_batch_transfer, transfer_batch_to_device (else the strategy's move), on_after_batch_transfer."""
    owners, strategy = t.hooks.transfer, t.strategy
    if not owners:
        return strategy.batch_to_device(batch)
    if "on_before_batch_transfer" in owners:
        hook = owners["on_before_batch_transfer"].on_before_batch_transfer
        batch = run_as(t, "on_before_batch_transfer", hook, batch, dataloader_idx)
    if "transfer_batch_to_device" in owners:
        hook = owners["transfer_batch_to_device"].transfer_batch_to_device
        batch = run_as(t, "transfer_batch_to_device", hook, batch, strategy.root_device, dataloader_idx)
    else:
        batch = strategy.batch_to_device(batch)
    if "on_after_batch_transfer" in owners:
        hook = owners["on_after_batch_transfer"].on_after_batch_transfer
        batch = run_as(t, "on_after_batch_transfer", hook, batch, dataloader_idx)
    return batch
