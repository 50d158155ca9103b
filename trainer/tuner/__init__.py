"""Tuner: Lightning's lr_find and scale_batch_size, run before training on the trainer's own loop.

Each sets up the stage as fit (validate, test, predict) would, runs its finder (callbacks/finders/lr_finder.py,
callbacks/finders/batch_size_finder.py), restores everything it changed and ends the stage without training, so a
``trainer.fit(task)`` afterwards starts as if the Tuner had not run, apart from the rate or batch size it set.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tandem_core.errors import ConfigError

if TYPE_CHECKING:
    from trainer.task.base import Task
    from trainer.task.datamodule import DataModule
    from trainer.trainer import Trainer
    from trainer.tuner.lr_finder import _LRFinder

METHODS = ("fit", "validate", "test", "predict")


class Tuner:
    """``Tuner(trainer).lr_find(task)`` / ``.scale_batch_size(task)``. Example::

    tuner = Tuner(trainer)
    finder = tuner.lr_find(task)          # task.lr (or task.hparams.lr) set to the suggestion
    finder.plot(suggest=True)
    tuner.scale_batch_size(task, mode="binsearch")   # task.batch_size set
    trainer.fit(task)
    """

    def __init__(self, trainer: Trainer) -> None:
        self._trainer = trainer

    def scale_batch_size(
        self, model: Task, train_dataloaders: Any = None, val_dataloaders: Any = None, dataloaders: Any = None,
        datamodule: DataModule | None = None, method: str = "fit", mode: str = "power", steps_per_trial: int = 3,
        init_val: int = 2, max_trials: int = 25, batch_arg_name: str = "batch_size", margin: float = 0.05,
        max_val: int = 8192,
    ) -> int | None:  # fmt: skip
        """The largest batch size that runs without running out of memory (see BatchSizeFinder), set on the task."""
        from callbacks.finders.batch_size_finder import BatchSizeFinder

        _check(train_dataloaders, val_dataloaders, dataloaders, method)
        t = self._trainer
        if t.strategy.name in ("ddp", "fsdp"):
            raise ConfigError(
                "scale_batch_size works on one process (as Lightning's); tune without ddp/fsdp."
            )
        if any(isinstance(cb, BatchSizeFinder) for cb in t.callbacks):
            raise ConfigError(
                "the Trainer already has a BatchSizeFinder callback; remove it to use the Tuner."
            )
        finder = BatchSizeFinder(mode, steps_per_trial, init_val, max_trials, batch_arg_name, margin, max_val)
        self._run(finder, method, model, train_dataloaders, val_dataloaders, dataloaders, datamodule,
                  lambda task: finder.scale_batch_size(t, task))  # fmt: skip
        return finder.optimal_batch_size

    def lr_find(
        self, model: Task, train_dataloaders: Any = None, val_dataloaders: Any = None, dataloaders: Any = None,
        datamodule: DataModule | None = None, method: str = "fit", min_lr: float = 1e-8, max_lr: float = 1,
        num_training: int = 100, mode: str = "exponential", early_stop_threshold: float | None = 4.0,
        update_attr: bool = True, attr_name: str = "",
    ) -> _LRFinder | None:  # fmt: skip
        """The learning-rate range test (see LearningRateFinder); returns its results (``suggestion()``, ``plot()``)."""
        from callbacks.finders.lr_finder import LearningRateFinder

        if method != "fit":
            raise ConfigError("lr_find runs with method='fit' only (as Lightning's).")
        _check(train_dataloaders, val_dataloaders, dataloaders, method)
        t = self._trainer
        if any(isinstance(cb, LearningRateFinder) for cb in t.callbacks):
            raise ConfigError(
                "the Trainer already has a LearningRateFinder callback; remove it to use the Tuner."
            )
        finder = LearningRateFinder(
            min_lr, max_lr, num_training, mode, early_stop_threshold, update_attr, attr_name
        )
        self._run(finder, method, model, train_dataloaders, val_dataloaders, dataloaders, datamodule,
                  lambda task: finder.lr_find(t, task))  # fmt: skip
        return finder.optimal_lr

    def _run(
        self, finder: Any, method: str, model: Task, train: Any, val: Any, loaders: Any, dm: Any, run: Any
    ) -> None:
        """Set the stage up with `finder` first among the callbacks, run it, and end the stage without training."""
        from trainer.loop.session import Session
        from trainer.task.datamodule import DataModule

        t = self._trainer
        if isinstance(train, DataModule):
            dm, train = train, None
        if isinstance(loaders, DataModule):
            dm, loaders = loaders, None
        t.strategy.launch()
        t.callbacks = [finder, *t.callbacks]
        try:
            fit = method == "fit"
            with Session(
                t, method, model, dm, None, train if fit else None, val if fit else loaders
            ) as session:
                run(session.task)
        finally:
            t.callbacks = [cb for cb in t.callbacks if cb is not finder]


def _check(train: Any, val: Any, loaders: Any, method: str) -> None:
    if method not in METHODS:
        raise ConfigError(f"method {method!r} is invalid; it should be one of {METHODS}.")
    if method == "fit" and loaders is not None:
        raise ConfigError("with method='fit' pass train_dataloaders and val_dataloaders, not dataloaders.")
    if method != "fit" and (train is not None or val is not None):
        raise ConfigError(
            f"with method={method!r} pass dataloaders, not train_dataloaders or val_dataloaders."
        )


__all__ = ["Tuner"]
