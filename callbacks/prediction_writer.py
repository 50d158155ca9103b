"""BasePredictionWriter: write predict()'s outputs yourself, batch by batch or once at the end."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from callbacks.base import Callback
from strategies.data.indices import batch_indices
from tandem_core.errors import ConfigError

if TYPE_CHECKING:
    from trainer.task.base import Task
    from trainer.trainer import Trainer

INTERVALS = ("batch", "epoch", "batch_and_epoch")


class WriterStepError(ConfigError, NotImplementedError):
    """A prediction writer with a `predict_step(self, dataloader_iter)`: the writer cannot tell which samples a
    step read (Lightning raises NotImplementedError, at setup)."""


class BasePredictionWriter(Callback):
    """Override ``write_on_batch_end`` (`write_interval` "batch"), ``write_on_epoch_end`` ("epoch") or both.

    Each call gets the dataset indices of its samples, so that under ddp, where every process predicts its
    own share of the data (each sample exactly once), the writers' files together hold every prediction
    once. Example::

        class Writer(BasePredictionWriter):
            def write_on_batch_end(self, trainer, task, prediction, batch_indices, batch, batch_idx, dataloader_idx):
                torch.save(prediction, f"out/{trainer.global_rank}-{batch_idx}.pt")
    """

    def __init__(self, write_interval: str = "batch") -> None:
        if write_interval not in INTERVALS:
            raise ConfigError(f"write_interval should be one of {list(INTERVALS)}, got {write_interval!r}.")
        self.interval = write_interval
        self._predictions: list[list[Any]] = []
        self._indices: list[list[Any]] = []

    @property
    def _on_batch(self) -> bool:
        return self.interval in ("batch", "batch_and_epoch")

    @property
    def _on_epoch(self) -> bool:
        return self.interval in ("epoch", "batch_and_epoch")

    def write_on_batch_end(
        self, trainer: Trainer, pl_module: Task, prediction: Any, batch_indices: Sequence[int] | None,
        batch: Any, batch_idx: int, dataloader_idx: int,
    ) -> None:  # fmt: skip
        """Write one batch's prediction (override)."""
        raise NotImplementedError

    def write_on_epoch_end(
        self, trainer: Trainer, pl_module: Task, predictions: Sequence[Any], batch_indices: Sequence[Any]
    ) -> None:
        """Write every prediction (one list per loader when there are several) with their indices (override)."""
        raise NotImplementedError

    def setup(self, trainer: Trainer, task: Task, stage: str) -> None:
        """As Lightning, at setup of any stage: a predict_step that reads its own batches is refused."""
        try:
            params = inspect.signature(task.predict_step).parameters
        except (TypeError, ValueError, AttributeError):
            return
        p = params.get("dataloader_iter")
        if p is not None and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            raise WriterStepError(
                f"{type(self).__name__} cannot write the predictions of `predict_step(self, dataloader_iter)`: "
                "the step reads its own batches, so the writer cannot tell their sample indices. Take a batch "
                "(`predict_step(self, batch, batch_idx)`) or write the outputs from the step yourself."
            )

    def on_predict_epoch_start(self, trainer: Trainer, task: Task) -> None:
        n = len(trainer.loaders.get("predict", []))
        self._predictions, self._indices = [[] for _ in range(n)], [[] for _ in range(n)]

    def on_predict_batch_end(
        self, trainer: Trainer, task: Task, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        indices = batch_indices(trainer.loaders["predict"][dataloader_idx], batch_idx)
        if self._on_epoch:
            self._predictions[dataloader_idx].append(outputs)
            self._indices[dataloader_idx].append(indices)
        if self._on_batch:
            self.write_on_batch_end(trainer, task, outputs, indices, batch, batch_idx, dataloader_idx)

    def on_predict_epoch_end(self, trainer: Trainer, task: Task) -> None:
        if not self._on_epoch:
            return
        predictions = self._predictions[0] if len(self._predictions) == 1 else self._predictions
        self.write_on_epoch_end(trainer, task, predictions, self._indices)
        self._predictions, self._indices = [], []
