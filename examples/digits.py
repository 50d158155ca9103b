"""Train a small MLP on scikit-learn's bundled 8x8 digits (no download) and print the validation accuracy.

Run ``make run`` (or ``python examples/digits.py``). Every Trainer choice is a command-line override::

    python examples/digits.py --max-epochs 20 --lr 0.005
    python examples/digits.py --precision bf16-mixed
    python examples/digits.py --strategy ddp --devices 2

The Task and DataModule are importable: ``from examples.digits import DigitsTask, DigitsData``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from trainer import DataModule, Task, Trainer, seed_everything  # noqa: E402


class DigitsData(DataModule):
    """The 1797 digits of ``sklearn.datasets.load_digits`` as 64 features in [0, 1], split train/val.

    Example: ``Trainer(max_epochs=5).fit(DigitsTask(), datamodule=DigitsData(batch_size=64))``.
    """

    def __init__(self, batch_size: int = 64, val_fraction: float = 0.2, split_seed: int = 0) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.val_fraction = val_fraction
        self.split_seed = split_seed
        self.train_set: TensorDataset | None = None
        self.val_set: TensorDataset | None = None

    def setup(self, stage: str) -> None:
        """Load the bundled data and split it the same way on every rank (a fixed split seed)."""
        if self.train_set is not None:
            return
        from sklearn.datasets import load_digits  # bundled with scikit-learn: nothing is downloaded

        digits = load_digits()
        x = torch.tensor(digits.data, dtype=torch.float32) / 16.0  # pixel values are 0..16
        y = torch.tensor(digits.target, dtype=torch.long)
        order = torch.randperm(len(y), generator=torch.Generator().manual_seed(self.split_seed))
        n_val = int(len(y) * self.val_fraction)
        val, train = order[:n_val], order[n_val:]
        self.train_set = TensorDataset(x[train], y[train])
        self.val_set = TensorDataset(x[val], y[val])

    def train_dataloader(self) -> DataLoader:
        assert self.train_set is not None, "call setup() first"
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        assert self.val_set is not None, "call setup() first"
        return DataLoader(self.val_set, batch_size=256)


class DigitsTask(Task):
    """A 64 -> hidden -> 10 MLP classifier trained with Adam.

    Example: ``DigitsTask(hidden=128, lr=1e-2)``.
    """

    def __init__(self, hidden: int = 128, lr: float = 1e-2, dropout: float = 0.1) -> None:
        super().__init__()
        self.save_hyperparameters()
        from torchmetrics.classification import MulticlassAccuracy

        self.net = torch.nn.Sequential(
            torch.nn.Linear(64, hidden),
            torch.nn.ReLU(),
            torch.nn.Dropout(dropout),
            torch.nn.Linear(hidden, 10),
        )
        self.val_acc = MulticlassAccuracy(num_classes=10, average="micro")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        logits = self(x)
        self.log("val/loss", F.cross_entropy(logits, y), on_epoch=True)
        self.val_acc(logits, y)
        self.log("val/acc", self.val_acc, on_epoch=True, prog_bar=True)

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


def _devices(value: str) -> int | str:
    return value if value == "auto" else int(value)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--max-epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--strategy", default="auto", help="auto, single, dp, ddp, ... (passed to Trainer as is)")
    p.add_argument("--devices", type=_devices, default="auto", help="an int, or auto")
    p.add_argument("--accelerator", default="auto", help="auto, cpu, cuda, mps")
    p.add_argument("--precision", default="32-true", help="32-true, bf16-mixed, 16-mixed, 64-true")
    p.add_argument("--accumulate-grad-batches", type=int, default=1)
    p.add_argument("--num-threads", type=int, default=1, help="torch CPU threads (0: torch's default)")
    p.add_argument("--root-dir", default="runs/digits", help="where logs and checkpoints go")
    p.add_argument("--no-logger", action="store_true", help="do not write TensorBoard logs")
    p.add_argument("--no-progress-bar", action="store_true")
    p.add_argument("--no-checkpointing", action="store_true")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> float | None:
    """Train and validate; print and return the final validation accuracy (None on ranks that are not 0)."""
    args = parse_args(argv)
    threads = torch.get_num_threads()
    if args.num_threads > 0:  # a model this small runs fastest on one thread; more only add contention
        torch.set_num_threads(args.num_threads)
    try:
        return _train(args)
    finally:
        torch.set_num_threads(threads)  # main() is also called from tests: leave the process as it was


def _train(args: argparse.Namespace) -> float | None:
    seed_everything(args.seed, workers=True)
    task = DigitsTask(hidden=args.hidden, lr=args.lr)
    data = DigitsData(batch_size=args.batch_size)
    trainer = Trainer(
        max_epochs=args.max_epochs,
        strategy=args.strategy,
        devices=args.devices,
        accelerator=args.accelerator,
        precision=args.precision,
        accumulate_grad_batches=args.accumulate_grad_batches,
        default_root_dir=args.root_dir,
        logger=not args.no_logger,
        enable_progress_bar=not args.no_progress_bar,
        enable_checkpointing=not args.no_checkpointing,
    )
    trainer.fit(task, datamodule=data)
    acc = trainer.callback_metrics.get("val/acc")  # the last epoch's validation accuracy
    if acc is None or not trainer.is_global_zero:
        return None
    trainer.print(f"val/acc = {float(acc):.3f}")
    return float(acc)


if __name__ == "__main__":
    main()
