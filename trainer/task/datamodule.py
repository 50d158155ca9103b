"""DataModule: the data side of an experiment, reusable across tasks (Lightning's LightningDataModule)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from strategies.batch import move_to_device
from tandem_core.errors import CheckpointError, TaskError
from tandem_core.hooks import default
from trainer.task.attributes import _no_loader
from trainer.task.hparams import HyperparametersMixin

if TYPE_CHECKING:
    from trainer.trainer import Trainer


class DataModule(HyperparametersMixin):
    """Groups the loaders of a data set. Example::

    class Digits(DataModule):
        def setup(self, stage): self.train, self.val = ...
        def train_dataloader(self): return DataLoader(self.train, batch_size=64, shuffle=True)
    """

    trainer: Trainer | None = None  # set when a stage starts

    # Lightning's LightningDataModule has the four (raising); the session asks only for those defined
    train_dataloader = _no_loader("train_dataloader")
    val_dataloader = _no_loader("val_dataloader")
    test_dataloader = _no_loader("test_dataloader")
    predict_dataloader = _no_loader("predict_dataloader")

    @default
    def prepare_data(self) -> None:
        """Download or prepare files; called once per node (local rank 0) before setup."""

    def setup(self, stage: str) -> None:
        """Build data sets for `stage` ('fit', 'validate', 'test', 'predict'), on every rank."""

    def teardown(self, stage: str) -> None:
        """Release what setup built."""

    def state_dict(self) -> dict[str, Any]:
        """State saved in checkpoints."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what state_dict returned."""

    # ----- batch transfer (used instead of the task's when overridden here, as in Lightning) -------
    @default
    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Change the batch before it is moved to the device."""
        return batch

    @default
    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        """Move the batch to `device` (tensors in lists, tuples, dicts and dataclasses)."""
        return move_to_device(batch, device)

    @default
    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Change the batch after it was moved to the device."""
        return batch

    @default
    def on_exception(self, exception: BaseException) -> None:
        """Called when fit/validate/test/predict raises."""

    @classmethod
    def load_from_checkpoint(
        cls, checkpoint_path: str, map_location: Any = None, hparams_file: str | None = None, **kwargs: Any
    ) -> Any:
        """A new DataModule of this class from a Trainer checkpoint: built from the saved DataModule
        hyperparameters (updated by `kwargs`), with its saved state loaded. Plain data only, as every load."""
        from strategies.checkpoint.io import load
        from trainer.checkpoint.format import decode_for, missing

        if hparams_file is not None:
            raise TaskError(
                "load_from_checkpoint(hparams_file=...) is not supported; pass the values as keywords."
            )
        ckpt = load(checkpoint_path, map_location if map_location is not None else "cpu")
        hparams = ckpt.get("datamodule_hyper_parameters") or {}
        absent = {k: v for k, v in missing(hparams).items() if k not in kwargs}
        if absent:
            raise CheckpointError(
                f"checkpoint {checkpoint_path!r} could not store DataModule hyperparameters {absent}; pass them: "
                f"{cls.__name__}.load_from_checkpoint(path, {', '.join(f'{k}=...' for k in absent)})"
            )
        dm = cls(
            **{
                **decode_for(cls, {k: v for k, v in hparams.items() if k not in kwargs}, checkpoint_path),
                **kwargs,
            }
        )
        if ckpt.get("datamodule"):  # Lightning loads the state only when one was saved
            dm.load_state_dict(ckpt["datamodule"])
        return dm
