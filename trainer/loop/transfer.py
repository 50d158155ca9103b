"""Moving a batch to the device, through the task's batch-transfer hooks where it overrides them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainer.trainer import Trainer


def to_device(t: Trainer, batch: Any, dataloader_idx: int = 0) -> Any:
    """on_before_batch_transfer, transfer_batch_to_device (else the strategy's move), on_after_batch_transfer."""
    task, custom, strategy = t.task, t.hooks.custom, t.strategy
    if not custom:
        return strategy.batch_to_device(batch)
    assert task is not None
    if "on_before_batch_transfer" in custom:
        batch = task.on_before_batch_transfer(batch, dataloader_idx)
    if "transfer_batch_to_device" in custom:
        batch = task.transfer_batch_to_device(batch, strategy.root_device, dataloader_idx)
    else:
        batch = strategy.batch_to_device(batch)
    if "on_after_batch_transfer" in custom:
        batch = task.on_after_batch_transfer(batch, dataloader_idx)
    return batch
