"""The Trainer's loaders and batch counts read back as Lightning documents them (``trainer.val_dataloaders``,
``trainer.num_training_batches``, ``trainer.estimated_stepping_batches``, ...): a mixin of Trainer."""

from __future__ import annotations

from typing import Any

from trainer.utilities.combined_loader import CombinedLoader


class TrainerLoaders:
    """The current stage's loaders as the user gave them, and their batch counts after the limits."""

    loaders: dict[str, list[Any]]
    loader_sizes: dict[str, list[int | float]]
    loader_iterables: dict[str, Any]  # phase -> its loaders in the form given (set when a stage loads them)
    session: Any
    config: Any
    accumulate_grad_batches: int
    max_steps: int

    @property
    def train_dataloader(self) -> Any:
        """The training loader of the current fit (of several loaders: their collection, as Lightning)."""
        loader = (self.loaders.get("train") or [None])[0]
        return loader.iterables if isinstance(loader, CombinedLoader) else loader

    @property
    def val_dataloaders(self) -> Any:
        """The validation loader(s) of the current stage as given (one loader, or the list or dict of them,
        each ready: sharded, limited), or None, as Lightning's."""
        return self.loader_iterables.get("val")

    @property
    def test_dataloaders(self) -> Any:
        """The test loader(s) of the current stage as given, or None."""
        return self.loader_iterables.get("test")

    @property
    def predict_dataloaders(self) -> Any:
        """The predict loader(s) of the current stage as given, or None."""
        return self.loader_iterables.get("predict")

    @property
    def num_training_batches(self) -> int | float:
        """The number of training batches an epoch runs (after limit_train_batches)."""
        return (self.loader_sizes.get("train") or [0])[0]

    @property
    def num_val_batches(self) -> list[int | float]:
        """The number of batches of each validation loader (after limit_val_batches)."""
        return self._eval_batches("val")

    @property
    def num_test_batches(self) -> list[int | float]:
        """The number of batches of each test loader (after limit_test_batches)."""
        return self._eval_batches("test")

    def _eval_batches(self, phase: str) -> list[int | float]:
        """Batches per loader; a CombinedLoader of combined batches counts each of its loaders (Lightning's)."""
        loaders, sizes = self.loaders.get(phase, []), self.loader_sizes.get(phase, [])
        if len(loaders) == 1 and isinstance(loaders[0], CombinedLoader):
            return list(loaders[0].limits or sizes)
        return sizes

    @property
    def num_predict_batches(self) -> list[int | float]:
        """The number of batches of each predict loader (after limit_predict_batches)."""
        return self.loader_sizes.get("predict", [])

    @property
    def estimated_stepping_batches(self) -> int | float:
        """Optimizer steps the whole fit will take (for schedulers such as OneCycleLR). As Lightning, asks for
        the training loader when configure_optimizers reads this before the loop did."""
        if self.session is not None and self.session.stage == "fit" and "train" not in self.loaders:
            self.session.load("train")
        per_epoch = -(-self.num_training_batches // self.accumulate_grad_batches)
        by_epochs = per_epoch * self.config.max_epochs if self.config.max_epochs != -1 else float("inf")
        return min(by_epochs, self.max_steps) if self.max_steps != -1 else by_epochs
