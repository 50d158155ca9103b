"""Session: what surrounds one stage's loop: attach the task, collect hooks, set up data and optimizers,
restore a checkpoint, handle stop signals; afterwards tear everything down (also after an error)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import torch

from trainer import checkpoint
from trainer.data import num_batches, with_worker_seeding
from trainer.errors import TaskError
from trainer.hooks import Hooks
from trainer.optim import TaskOptimizer, check_optimizers, parse_optimizers
from trainer.reporting import finalize_loggers
from trainer.signals import StopSignals
from trainer.task import Task

if TYPE_CHECKING:
    from trainer.datamodule import DataModule
    from trainer.trainer import Trainer

PHASE = {"fit": "val", "validate": "val", "test": "test", "predict": "predict"}  # a stage's evaluation phase
LIMIT = {"train": "limit_train_batches", "val": "limit_val_batches", "test": "limit_test_batches",
         "predict": "limit_predict_batches"}  # fmt: skip


class Session:
    """``with Session(trainer, "fit", task, datamodule, ckpt_path, train, evals): loop.fit(trainer)``."""

    def __init__(
        self, trainer: Trainer, stage: str, task: Task | None, dm: DataModule | None, ckpt_path: str | None,
        train: Any, evals: Any,
    ) -> None:  # fmt: skip
        self.t, self.stage, self.ckpt_path, self.train, self.evals = trainer, stage, ckpt_path, train, evals
        task = task if task is not None else trainer.task
        if not isinstance(task, Task):
            raise TaskError(f"{stage}() needs a trainer.Task, got {type(task).__name__}.")
        self.task = task
        self.dm = dm or trainer.datamodule
        self.signals = StopSignals(trainer) if stage == "fit" else None

    def __enter__(self) -> Session:
        t, task, stage = self.t, self.task, self.stage
        t.task, t.datamodule, t.state.stage = task, self.dm, stage
        task._trainer = t
        _set_deterministic(t.config.deterministic)
        t.hooks = Hooks(task, t.callbacks, t)  # only the overridden hooks, collected once per stage
        if self.signals is not None:
            self.signals.install()
        try:
            self._setup()
        except BaseException as e:
            self.__exit__(type(e), e, None)
            raise
        return self

    def _setup(self) -> None:
        t, task, stage, dm = self.t, self.task, self.stage, self.dm
        if dm is not None:
            if t.is_global_zero:
                dm.prepare_data()
            t.strategy.comm.barrier("prepare_data")
            dm.setup(stage)
        t.hooks.call("setup", stage)
        t.hooks.call("configure_model")
        t.strategy.setup(task)
        self._load_data()
        if stage == "fit":
            t.optimizers, t.lr_scheduler_configs = parse_optimizers(task.configure_optimizers())
            check_optimizers(t.optimizers, task.automatic_optimization, t.config.accumulate_grad_batches)
            task._optimizers = [TaskOptimizer(o, t) for o in t.optimizers]
        path = self.ckpt_path
        if path is None and stage == "fit" and t.config.resume == "auto":
            path = t.strategy.comm.broadcast(checkpoint.find_last(t))  # every rank loads the same file
        if path is not None:
            checkpoint.restore(t, path, stage)

    def _load_data(self) -> None:
        t, stage = self.t, self.stage
        t.loaders, t.loader_sizes = {}, {}
        if stage == "fit":
            train = self.train if self.train is not None else self._source("train_dataloader")
            if train is None:
                raise TaskError(
                    "fit() needs training data: pass train_dataloaders, a datamodule, or define "
                    "train_dataloader() on the task."
                )
            self._add("train", [train])
        phase = PHASE[stage]
        evals = self.evals if self.evals is not None else self._source(f"{phase}_dataloader")
        if evals is None and stage != "fit":
            raise TaskError(
                f"{stage}() needs data: pass dataloaders, a datamodule, or define {phase}_dataloader() on the task."
            )
        self._add(phase, [] if evals is None else list(evals) if isinstance(evals, (list, tuple)) else [evals])

    def _add(self, phase: str, loaders: list[Any]) -> None:
        t = self.t
        prepared = [with_worker_seeding(t.strategy.process_dataloader(dl, phase)) for dl in loaders]
        limit = getattr(t.config, LIMIT[phase])
        t.loaders[phase], t.loader_sizes[phase] = prepared, [num_batches(dl, limit) for dl in prepared]

    def _source(self, name: str) -> Any:
        for owner in (self.dm, self.task):
            fn = getattr(owner, name, None)
            if callable(fn):
                return fn()
        return None

    def __exit__(self, kind: Any, error: BaseException | None, tb: Any) -> None:
        t = self.t
        try:
            if error is not None:
                t.hooks.call("on_exception", error)
                finalize_loggers(t, "failed")
        finally:
            if self.signals is not None:
                self.signals.restore()
            t.hooks.call("teardown", self.stage)
            if self.dm is not None:
                self.dm.teardown(self.stage)
            t.strategy.teardown()


def _set_deterministic(det: bool | str | None) -> None:
    if det is None:
        return
    if det:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(bool(det), warn_only=det == "warn")
