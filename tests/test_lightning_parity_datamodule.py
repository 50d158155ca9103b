"""DataModule surface compared with Lightning's LightningDataModule (pytorch_lightning, the reference extra):
``str(dm)``, ``from_datasets``, the demo DataModules, the raising *_dataloader defaults."""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest
import torch
from torch.utils.data import Dataset, IterableDataset, RandomSampler, SequentialSampler

pl = pytest.importorskip("pytorch_lightning")
from pytorch_lightning.demos import boring_classes as plb  # noqa: E402

from tandem_core.errors import TandemError  # noqa: E402
from trainer import DataModule, demos  # noqa: E402


class _DS(Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([float(i)])


class _IDS(IterableDataset):
    def __iter__(self) -> Any:
        return iter(torch.arange(8.0).unsqueeze(1))


@pytest.mark.parametrize("stage", [None, "fit", "validate", "test", "predict"])
@pytest.mark.parametrize("name", ["BoringDataModule", "BoringDataModuleNoLen", "IterableBoringDataModule"])
def test_str_of_the_demo_datamodules_equals_lightnings(name: str, stage: str | None) -> None:
    ours, theirs = getattr(demos, name)(), getattr(plb, name)()
    if stage is not None:
        ours.setup(stage)
        theirs.setup(stage)
    assert str(ours) == str(theirs)
    assert str(ours).count(os.linesep) == 3


def _describe(loaders: Any) -> Any:
    if isinstance(loaders, dict):
        return {k: _describe(v) for k, v in loaders.items()}
    if isinstance(loaders, (list, tuple)):
        return [_describe(v) for v in loaders]
    sampler = type(loaders.sampler).__name__ if not isinstance(loaders.dataset, IterableDataset) else None
    return (loaders.dataset, loaders.batch_size, loaders.num_workers, loaders.pin_memory, sampler)


@pytest.mark.parametrize("iterable", [False, True])
def test_from_datasets_builds_lightnings_loaders(iterable: bool) -> None:
    ds = _IDS if iterable else _DS
    train, vals, tests, preds = ds(), [ds(), ds()], {"a": ds()}, ds()
    ours = DataModule.from_datasets(train, vals, tests, preds, batch_size=4, num_workers=0)
    theirs = pl.LightningDataModule.from_datasets(train, vals, tests, preds, batch_size=4, num_workers=0)
    for name in ("train_dataloader", "val_dataloader", "test_dataloader", "predict_dataloader"):
        assert _describe(getattr(ours, name)()) == _describe(getattr(theirs, name)())
    if not iterable:
        assert isinstance(ours.train_dataloader().sampler, RandomSampler)
        assert isinstance(ours.val_dataloader()[0].sampler, SequentialSampler)
    # a loader not given stays the raising default, in both
    only_val = DataModule.from_datasets(val_dataset=ds())
    with pytest.raises(TandemError):
        only_val.train_dataloader()
    with pytest.raises(pl.utilities.exceptions.MisconfigurationException):
        pl.LightningDataModule.from_datasets(val_dataset=ds()).train_dataloader()
    assert str(only_val) == str(pl.LightningDataModule.from_datasets(val_dataset=ds()))


def test_from_datasets_passes_batch_size_and_num_workers_where_init_takes_them() -> None:
    def make(base: type) -> tuple[type, type, type]:
        class Known(base):  # type: ignore[misc,valid-type]
            def __init__(self, batch_size: int = 1, num_workers: int = 0) -> None:
                super().__init__()
                self.batch_size, self.num_workers = batch_size, num_workers

        class Unknown(base):  # type: ignore[misc,valid-type]
            def __init__(self, other: int = 0) -> None:
                super().__init__()
                self.other = other

        class Anything(base):  # type: ignore[misc,valid-type]
            def __init__(self, **kwargs: Any) -> None:
                super().__init__()
                self.kwargs = kwargs

        return Known, Unknown, Anything

    for base in (DataModule, pl.LightningDataModule):
        known, unknown, anything = make(base)
        dm = known.from_datasets(_DS(), batch_size=4, num_workers=2)
        assert (dm.batch_size, dm.num_workers) == (4, 2)
        assert unknown.from_datasets(_DS(), batch_size=4, other=3).other == 3
        assert anything.from_datasets(_DS(), batch_size=4, extra=1).kwargs == {
            "extra": 1,
            "batch_size": 4,
            "num_workers": 0,
        }
        base.from_datasets(_DS(), batch_size=4, num_workers=2)  # the base takes neither: not passed


def test_datamodule_has_lightnings_raising_loader_defaults() -> None:
    dm = DataModule()
    for name in ("train_dataloader", "val_dataloader", "test_dataloader", "predict_dataloader"):
        assert hasattr(pl.LightningDataModule, name)
        with pytest.raises(TandemError):
            getattr(dm, name)()


def test_the_runner_classifies_patching_torchs_dataloader_inside_lightning_as_internal() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.join(here, "..", "tools", "lightning_suite"))
    try:
        from classify import _foreign
    finally:
        sys.path.pop(0)
    assert _foreign("lightning.pytorch.core.datamodule.DataLoader".split("."))  # torch's, imported there
    assert not _foreign(
        "lightning.pytorch.callbacks.progress.tqdm_progress.Tqdm".split(".")
    )  # Lightning's own
