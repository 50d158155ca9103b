"""DataModule: the data side of an experiment, reusable across tasks (Lightning's LightningDataModule)."""

from __future__ import annotations

import inspect
import os
from collections.abc import Mapping, Sized
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from strategies.batch import move_to_device
from tandem_core.errors import CheckpointError
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
    # the checkpoint keys of its hyperparameters (Lightning's names and values)
    CHECKPOINT_HYPER_PARAMS_KEY = "datamodule_hyper_parameters"
    CHECKPOINT_HYPER_PARAMS_NAME = "datamodule_hparams_name"
    CHECKPOINT_HYPER_PARAMS_TYPE = "datamodule_hparams_type"

    # Lightning's LightningDataModule has the four (raising); the session asks only for those defined
    train_dataloader = _no_loader("train_dataloader")
    val_dataloader = _no_loader("val_dataloader")
    test_dataloader = _no_loader("test_dataloader")
    predict_dataloader = _no_loader("predict_dataloader")

    def __init__(self) -> None:
        """No arguments (as LightningDataModule): a subclass takes its own and may save them as hyperparameters."""
        super().__init__()

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
    def from_datasets(
        cls,
        train_dataset: Any = None,
        val_dataset: Any = None,
        test_dataset: Any = None,
        predict_dataset: Any = None,
        batch_size: int = 1,
        num_workers: int = 0,
        **datamodule_kwargs: Any,
    ) -> Any:
        """A DataModule whose loaders wrap the given data sets (each a Dataset, or a list/dict of them): batch_size,
        num_workers, pinned memory, the training data shuffled (unless iterable). `batch_size` and `num_workers`
        also go to ``__init__`` where it takes them; `datamodule_kwargs` always do. Example::

            dm = DataModule.from_datasets(train_ds, val_ds, batch_size=32)
        """
        params = inspect.signature(cls.__init__).parameters
        takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        special = {"batch_size": batch_size, "num_workers": num_workers}
        dm = cls(**datamodule_kwargs, **{k: v for k, v in special.items() if takes_any or k in params})

        def loaders(data: Any, shuffle: bool) -> Any:
            if isinstance(data, Dataset):
                return DataLoader(  # looked up at call time (a test may patch this module's DataLoader)
                    data,
                    batch_size=batch_size,
                    shuffle=shuffle and not isinstance(data, IterableDataset),
                    num_workers=num_workers,
                    pin_memory=True,
                )
            if isinstance(data, Mapping):
                return {k: loaders(v, shuffle) for k, v in data.items()}
            if isinstance(data, (list, tuple)):
                return type(data)(loaders(v, shuffle) for v in data)
            return data

        for name, data in (("train", train_dataset), ("val", val_dataset), ("test", test_dataset)):
            if data is not None:
                setattr(dm, f"{name}_dataloader", _bound(loaders, data, name == "train"))
        if predict_dataset is not None:
            dm.predict_dataloader = _bound(loaders, predict_dataset, False)
        return dm

    def __str__(self) -> str:
        """One line per loader method with the size of its data set(s): ``{Train dataloader: size=64}``, ``NA``
        for a data set without a length, ``None`` where the method gives no loader (yet), as Lightning prints."""
        return os.linesep.join(f"{{{label}: {self._describe(name)}}}" for label, name in _LOADER_LABELS)

    def _describe(self, name: str) -> str:
        try:
            loader = getattr(self, name)()
        except Exception:  # not set up yet, or not defined: Lightning shows None too
            return "None"
        if isinstance(loader, DataLoader):
            return _size(loader)
        items = list(loader.values()) if isinstance(loader, Mapping) else loader
        if not isinstance(items, (list, tuple)):
            return "None"
        return " ; ".join(
            f"{i}. {_size(x)}" if isinstance(x, DataLoader) else "None" for i, x in enumerate(items, start=1)
        )

    @classmethod
    def load_from_checkpoint(
        cls,
        checkpoint_path: str,
        map_location: Any = None,
        hparams_file: str | None = None,
        weights_only: bool | None = None,
        **kwargs: Any,
    ) -> Any:
        """A new DataModule of this class from a Trainer checkpoint: built from the saved DataModule
        hyperparameters (those of `hparams_file` instead when given; updated by `kwargs`), with its saved state
        loaded. Plain data only unless `weights_only=False` (a file you trust), as Task.load_from_checkpoint."""
        from strategies.checkpoint.io import load
        from trainer.checkpoint.format import decode_for, missing, rebuilt_form

        trust = weights_only is False
        ckpt = load(
            checkpoint_path, map_location if map_location is not None else "cpu", weights_only=not trust
        )
        if hparams_file is not None:  # Lightning's: that file's hyperparameters replace the saved ones
            from trainer.loggers.hparams_file import load_hparams_file

            ckpt["datamodule_hyper_parameters"] = dict(load_hparams_file(hparams_file))
        hparams = ckpt.get("datamodule_hyper_parameters") or {}
        if "_instantiator" in hparams:  # a LightningCLI run's: rebuilt from the config it saved
            from trainer.cli.instantiate import rebuild

            dm = rebuild(cls, hparams, kwargs, checkpoint_path)
            if ckpt.get("datamodule"):
                dm.load_state_dict(ckpt["datamodule"])
            return dm
        absent = {k: v for k, v in missing(hparams, trust).items() if k not in kwargs}
        if absent:
            raise CheckpointError(
                f"checkpoint {checkpoint_path!r} could not store DataModule hyperparameters {absent}; pass them: "
                f"{cls.__name__}.load_from_checkpoint(path, {', '.join(f'{k}=...' for k in absent)})"
            )
        kept = decode_for(cls, {k: v for k, v in hparams.items() if k not in kwargs}, checkpoint_path, trust)
        dm = cls(**{**rebuilt_form(cls, ckpt, kept, "datamodule_"), **kwargs})
        if ckpt.get("datamodule"):  # Lightning loads the state only when one was saved
            dm.load_state_dict(ckpt["datamodule"])
        return dm


_LOADER_LABELS = (
    ("Train dataloader", "train_dataloader"),
    ("Validation dataloader", "val_dataloader"),
    ("Test dataloader", "test_dataloader"),
    ("Predict dataloader", "predict_dataloader"),
)


def _size(loader: DataLoader) -> str:
    return f"size={len(loader.dataset) if isinstance(loader.dataset, Sized) else 'NA'}"


def _bound(make: Any, data: Any, shuffle: bool) -> Any:
    def dataloader() -> Any:
        return make(data, shuffle)

    return dataloader
