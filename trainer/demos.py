"""Small tasks and datasets for trying the trainer and writing tests (Lightning's ``demos.boring_classes``).

``BoringModel`` is a one-layer task on random 32-feature inputs whose loss pulls its outputs towards one;
subclass it and override the hook under test:

    class Probe(BoringModel):
        def on_train_epoch_end(self):
            print(self.trainer.current_epoch)

    Trainer(max_epochs=2, limit_train_batches=4).fit(Probe())
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, IterableDataset, Subset

from trainer.task.base import Task
from trainer.task.datamodule import DataModule


class RandomDataset(Dataset):
    """``length`` rows of ``size`` standard-normal features, drawn once."""

    def __init__(self, size: int, length: int) -> None:
        self.len = length
        self.data = torch.randn(length, size)

    def __getitem__(self, index: int) -> Tensor:
        return self.data[index]

    def __len__(self) -> int:
        return self.len


class RandomDictDataset(RandomDataset):
    """As RandomDataset, each row given as ``{"a": row, "b": row + 2}``."""

    def __getitem__(self, index: int) -> dict[str, Tensor]:  # type: ignore[override]
        row = self.data[index]
        return {"a": row, "b": row + 2}


class RandomIterableDataset(IterableDataset):
    """``count`` fresh random rows of ``size`` features per pass; no length."""

    def __init__(self, size: int, count: int) -> None:
        self.count = count
        self.size = size

    def __iter__(self) -> Iterator[Tensor]:
        return (torch.randn(self.size) for _ in range(self.count))


class RandomIterableDatasetWithLen(RandomIterableDataset):
    """RandomIterableDataset that also reports its length."""

    def __len__(self) -> int:
        return self.count


def _loader() -> DataLoader:
    return DataLoader(RandomDataset(32, 64))


class BoringModel(Task):
    """Linear(32, 2); loss: mean squared distance of the outputs from one. SGD(lr=0.1) with StepLR(1)."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(32, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.layer(x)

    def loss(self, preds: Tensor, labels: Tensor | None = None) -> Tensor:
        target = torch.ones_like(preds) if labels is None else labels
        return torch.nn.functional.mse_loss(preds, target)

    def step(self, batch: Any) -> Tensor:
        return self.loss(self(batch))

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        return {"loss": self.step(batch)}

    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        return {"x": self.step(batch)}

    def test_step(self, batch: Any, batch_idx: int) -> Any:
        return {"y": self.step(batch)}

    def configure_optimizers(self) -> Any:
        opt = torch.optim.SGD(self.parameters(), lr=0.1)
        return [opt], [torch.optim.lr_scheduler.StepLR(opt, step_size=1)]

    def train_dataloader(self) -> DataLoader:
        return _loader()

    def val_dataloader(self) -> DataLoader:
        return _loader()

    def test_dataloader(self) -> DataLoader:
        return _loader()

    def predict_dataloader(self) -> DataLoader:
        return _loader()


class ManualOptimBoringModel(BoringModel):
    """BoringModel stepping its optimizer itself (manual optimization)."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        opt = self.optimizers()
        loss = self.step(batch)
        opt.zero_grad()
        self.manual_backward(loss)
        opt.step()
        return loss


class _RandomLoaders:
    """One DataLoader per stage over the `random_<stage>` data set its DataModule's setup made."""

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.random_train)  # type: ignore[attr-defined]

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.random_val)  # type: ignore[attr-defined]

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.random_test)  # type: ignore[attr-defined]

    def predict_dataloader(self) -> DataLoader:
        return DataLoader(self.random_predict)  # type: ignore[attr-defined]


class BoringDataModule(_RandomLoaders, DataModule):
    """256 random rows split into four disjoint blocks of 64: train, val, test, predict."""

    def __init__(self) -> None:
        super().__init__()
        self.random_full = RandomDataset(32, 64 * 4)

    def setup(self, stage: str) -> None:
        blocks = {"fit": ("random_train", 0), "test": ("random_test", 2), "predict": ("random_predict", 3)}
        if stage in ("fit", "validate"):
            self.random_val = Subset(self.random_full, range(64, 128))
        if stage in blocks:
            name, k = blocks[stage]
            setattr(self, name, Subset(self.random_full, range(64 * k, 64 * (k + 1))))


class BoringDataModuleNoLen(_RandomLoaders, DataModule):
    """As BoringDataModule with iterable data sets of no length: 512 train, 128 val, 256 test, 64 predict rows."""

    _COUNTS = {"train": 512, "val": 128, "test": 256, "predict": 64}

    def setup(self, stage: str) -> None:
        for name in _stage_sets(stage):
            setattr(self, f"random_{name}", RandomIterableDataset(32, self._COUNTS[name]))


class IterableBoringDataModule(DataModule):
    """Two loaders per stage, a map-style and an iterable data set of 4 features each: 16 rows each for train,
    32 val, 64 test, 128 predict."""

    _COUNTS = {"train": 16, "val": 32, "test": 64, "predict": 128}

    def setup(self, stage: str) -> None:
        for name in _stage_sets(stage):
            n = self._COUNTS[name]
            setattr(self, f"{name}_datasets", [RandomDataset(4, n), RandomIterableDataset(4, n)])

    def train_dataloader(self) -> list[DataLoader]:
        return [DataLoader(ds) for ds in self.train_datasets]

    def val_dataloader(self) -> list[DataLoader]:
        return [DataLoader(ds) for ds in self.val_datasets]

    def test_dataloader(self) -> list[DataLoader]:
        return [DataLoader(ds) for ds in self.test_datasets]

    def predict_dataloader(self) -> list[DataLoader]:
        return [DataLoader(ds) for ds in self.predict_datasets]


def _stage_sets(stage: str) -> tuple[str, ...]:
    """The data sets a stage sets up (fit: train and val; validate: val; test; predict)."""
    return {"fit": ("train", "val"), "validate": ("val",), "test": ("test",), "predict": ("predict",)}.get(
        stage, ()
    )


class DemoModel(Task):
    """Linear(32, out_dim) + ReLU; loss: the sum of its outputs; Adam(learning_rate)."""

    def __init__(self, out_dim: int = 10, learning_rate: float = 0.02) -> None:
        super().__init__()
        self.l1 = torch.nn.Linear(32, out_dim)
        self.learning_rate = learning_rate

    def forward(self, x: Tensor) -> Tensor:
        return torch.relu(self.l1(x.view(x.size(0), -1)))

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        return self(batch[0] if isinstance(batch, (list, tuple)) else batch).sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.learning_rate)
