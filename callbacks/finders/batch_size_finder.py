"""BatchSizeFinder: find the largest batch size that fits in memory when a stage starts."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

from callbacks.base import Callback
from callbacks.finders import attrs
from tandem_core.errors import ConfigError

if TYPE_CHECKING:
    from trainer.task.base import Task
    from trainer.trainer import Trainer


class BatchSizeFinder(Callback):
    """Before fit (or validate, test, predict) starts, runs `steps_per_trial` steps at growing batch sizes from
    `init_val` ('power': doubling; 'binsearch': doubling, then bisecting; at most `max_trials` trials and
    `max_val`) until one runs out of memory; keeps the largest that ran (less `margin` with binsearch) in the
    task's or datamodule's `batch_arg_name`, from which its *_dataloader() builds the loaders. Everything else
    (weights, optimizer, loop, random state) is put back. The result is ``optimal_batch_size``.
    Example: ``Trainer(callbacks=[BatchSizeFinder(mode="binsearch")])``.
    """

    SUPPORTED_MODES = ("power", "binsearch")

    def __init__(
        self, mode: str = "power", steps_per_trial: int = 3, init_val: int = 2, max_trials: int = 25,
        batch_arg_name: str = "batch_size", margin: float = 0.05, max_val: int = 8192,
    ) -> None:  # fmt: skip
        mode = mode.lower()
        if mode not in self.SUPPORTED_MODES:
            raise ConfigError(f"BatchSizeFinder mode should be one of {self.SUPPORTED_MODES}, got {mode!r}.")
        if not 0.0 <= margin < 1.0:
            raise ConfigError(f"BatchSizeFinder margin should be in [0, 1), got {margin!r}.")
        self.optimal_batch_size: int | None = init_val
        self._mode, self._steps_per_trial, self._init_val = mode, steps_per_trial, init_val
        self._max_trials, self._batch_arg_name, self._margin, self._max_val = (
            max_trials,
            batch_arg_name,
            margin,
            max_val,
        )

    def setup(self, trainer: Trainer, task: Task, stage: str | None = None) -> None:
        if trainer.world_size > 1:
            raise ConfigError(
                "The batch size finder works on one process (as Lightning's); run it without ddp/fsdp."
            )
        session = trainer.session
        if session is not None and (session.train is not None or session.evals is not None):
            raise ConfigError(
                "The batch size finder changes the batch size the *_dataloader() methods read: it cannot resize "
                "dataloaders passed to fit()/validate()/...; build them in the task or a DataModule."
            )
        if not attrs.has(task, self._batch_arg_name):
            raise ConfigError(
                f"BatchSizeFinder: field {self._batch_arg_name!r} not found in the task, the datamodule, nor their hparams."
            )
        hparams = getattr(task, "hparams", {})
        if hasattr(task, self._batch_arg_name) and self._batch_arg_name in hparams:
            warnings.warn(
                f"task.{self._batch_arg_name} and task.hparams.{self._batch_arg_name} both exist; the search "
                "starts from init_val and sets both.",
                UserWarning,
                stacklevel=2,
            )

    def scale_batch_size(self, trainer: Trainer, pl_module: Task) -> None:
        """Run the batch-size search now and keep the result in `optimal_batch_size`."""
        if (
            len(
                trainer.loaders.get(
                    {"fit": "train", "validate": "val"}.get(
                        str(trainer.state.entry), str(trainer.state.entry)
                    ),
                    [],
                )
            )
            > 1
        ):
            raise ConfigError(f"The batch size finder works with one {trainer.state.entry} dataloader.")
        self.optimal_batch_size = trainer._scale_batch_size(
            self._mode, self._steps_per_trial, self._init_val, self._max_trials, self._batch_arg_name,
            self._margin, self._max_val,
        )  # fmt: skip

    def on_fit_start(self, trainer: Trainer, task: Task) -> None:
        self.scale_batch_size(trainer, task)

    def on_validation_start(self, trainer: Trainer, task: Task) -> None:
        if trainer.sanity_checking or trainer.state.entry != "validate":
            return
        self.scale_batch_size(trainer, task)

    def on_test_start(self, trainer: Trainer, task: Task) -> None:
        self.scale_batch_size(trainer, task)

    def on_predict_start(self, trainer: Trainer, task: Task) -> None:
        self.scale_batch_size(trainer, task)
