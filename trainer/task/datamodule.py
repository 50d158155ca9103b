"""DataModule: the data side of an experiment, reusable across tasks (Lightning's LightningDataModule)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainer.loop.hooks import default
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
