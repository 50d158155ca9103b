"""Task: the user's model, its steps, and the hooks the Trainer calls (Lightning's names)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch

from strategies.batch import is_metric
from tandem_core.errors import TaskError
from tandem_core.hooks import TASK, add_hook_stubs, default
from trainer.task.attributes import LightningAttributes
from trainer.task.defaults import TaskDefaults
from trainer.task.export import ExportMixin
from trainer.task.hparams import HyperparametersMixin

if TYPE_CHECKING:
    from trainer.trainer import Trainer

_Tensor = torch.Tensor


class NotAttachedError(TaskError, RuntimeError):
    """``task.trainer`` read before the task was given to a Trainer (a RuntimeError, as in Lightning)."""


class Task(LightningAttributes, TaskDefaults, ExportMixin, torch.nn.Module, HyperparametersMixin):
    """A torch Module that knows how to train itself.

    Example::

        class Classifier(Task):
            def __init__(self, lr=0.1):
                super().__init__(); self.save_hyperparameters(); self.net = torch.nn.Linear(4, 2)
            def training_step(self, batch, batch_idx):
                x, y = batch; loss = F.cross_entropy(self.net(x), y); self.log("train/loss", loss); return loss
            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)
    """

    def __init__(self) -> None:
        super().__init__()
        self._trainer: Trainer | None = None
        self._optimizers: list[Any] = []  # TaskOptimizer wrappers, set when fit starts
        self.automatic_optimization = True

    # ----- what the user implements -------------------------------------------------------------
    def training_step(self, batch: Any, batch_idx: int) -> Any:
        """Return the loss (a scalar tensor) or a dict with key 'loss'."""
        raise TaskError(f"{type(self).__name__} must implement training_step(self, batch, batch_idx).")

    @default
    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        """Compute and log validation metrics for one batch."""

    @default
    def test_step(self, batch: Any, batch_idx: int) -> Any:
        """Compute and log test metrics for one batch."""

    def predict_step(self, batch: Any, batch_idx: int = 0, dataloader_idx: int = 0) -> Any:
        """Return predictions for one batch (default: forward on the batch, or its first element)."""
        if type(self).forward is torch.nn.Module.forward:
            raise TaskError(f"{type(self).__name__} needs forward() or predict_step() to predict.")
        x = batch[0] if isinstance(batch, (list, tuple)) else batch
        return self(x)

    def configure_optimizers(self) -> Any:
        """Return an optimizer, a list of them, or a dict with 'optimizer' and 'lr_scheduler'."""
        raise TaskError(f"{type(self).__name__} must implement configure_optimizers() to be trained.")

    # ----- what the Trainer provides ------------------------------------------------------------
    @property
    def trainer(self) -> Trainer:
        """The Trainer running this task (outside one: NotAttachedError, a TaskError and a RuntimeError as Lightning's)."""
        if self._trainer is None:
            raise NotAttachedError(
                f"{type(self).__name__} is not attached to a `Trainer`; call trainer.fit(task) first."
            )
        return self._trainer

    @trainer.setter
    def trainer(self, trainer: Trainer | None) -> None:
        """Attach (or with None detach) this task and the tasks nested in it, as Lightning's setter does."""
        for child in self.children():
            if isinstance(child, Task):
                child.trainer = trainer
        self._trainer = trainer

    @property
    def device(self) -> torch.device:
        """The device the task's parameters are on."""
        if self._trainer is not None:
            return self._trainer.strategy.root_device
        p = next(self.parameters(), None)
        return p.device if p is not None else torch.device("cpu")

    @property
    def global_rank(self) -> int:
        """This process's global rank (0 outside a Trainer)."""
        return self._trainer.global_rank if self._trainer is not None else 0

    @property
    def local_rank(self) -> int:
        """This process's rank on its machine (0 outside a Trainer)."""
        return self._trainer.local_rank if self._trainer is not None else 0

    @property
    def current_epoch(self) -> int:
        """The Trainer's current epoch (0 outside a Trainer)."""
        return self._trainer.current_epoch if self._trainer is not None else 0

    @property
    def global_step(self) -> int:
        """The number of optimizer steps taken (0 outside a Trainer)."""
        return self._trainer.global_step if self._trainer is not None else 0

    def log(
        self,
        name: str,
        value: Any,
        prog_bar: bool = False,
        logger: bool | None = None,
        on_step: bool | None = None,
        on_epoch: bool | None = None,
        reduce_fx: str | Callable[..., Any] = "mean",
        enable_graph: bool = False,
        sync_dist: bool = False,
        sync_dist_group: Any = None,
        add_dataloader_idx: bool = True,
        batch_size: int | None = None,
        metric_attribute: str | None = None,
        rank_zero_only: bool = False,
    ) -> None:
        """Record a metric: Lightning's `LightningModule.log`, its arguments in its order (what each does:
        trainer/loggers/metrics.py, `MetricStore.log`, and docs/logging.md)."""
        t = self._trainer
        if t is None:  # as Lightning: a step method called outside a Trainer (a unit test) logs nothing
            warnings.warn(
                f"self.log({name!r}) outside a Trainer (the task is not attached to one): not logged",
                stacklevel=2,
            )
            return
        if batch_size is None and t.metric_store.iter_training and t.state.phase == "train":
            raise TaskError(  # as Lightning: the loop cannot tell the size of the batches the step read
                f"self.log({name!r}, ...) in training with `training_step(self, dataloader_iter)` needs "
                "batch_size=: the loop does not see the batches the step reads. Pass batch_size=<its size>."
            )
        if (
            type(value) is not _Tensor
            and metric_attribute is None
            and is_metric(value)
            and id(value) not in self._metric_ids()
        ):
            self._refuse_foreign_metric(name, value)
        t.metric_store.log(
            name, value, prog_bar, logger, on_step, on_epoch, reduce_fx, enable_graph, sync_dist,
            sync_dist_group, add_dataloader_idx, batch_size, rank_zero_only,
        )  # fmt: skip

    def _metric_ids(self, fresh: bool = False) -> set[int]:
        """The ids of the Metrics among the task's modules (looked up again when a logged one is not there)."""
        ids = self.__dict__.get("_tandem_metric_ids")
        if ids is None or fresh:
            ids = {id(m) for m in self.modules() if is_metric(m)}
            object.__setattr__(self, "_tandem_metric_ids", ids)
        return ids

    def _refuse_foreign_metric(self, name: str, value: Any) -> None:
        """As Lightning: a logged Metric must be one of the task's attributes, or its state is neither moved with
        the task, saved in its checkpoints nor reset with it (and a new one per step aggregates nothing)."""
        if id(value) in self._metric_ids(fresh=True):  # set as an attribute since the last look
            return
        owned = [n for n, m in self.named_modules() if is_metric(m)]
        fix = (
            f"log one of them, or pass `self.log({name}, ..., metric_attribute=name)` where `name` is one of {owned}"
            if owned
            else f"fix this by setting an attribute for the metric in your task (`self.metric = {type(value).__name__}(...)` in __init__) and log that"
        )
        raise TaskError(
            f"self.log({name!r}) got a {type(value).__name__} that is not an attribute of {type(self).__name__}: its "
            f"state would not move with the task, be saved in its checkpoints or be reset with it; {fix}."
        )

    def log_dict(
        self,
        dictionary: Mapping[str, Any],
        prog_bar: bool = False,
        logger: bool | None = None,
        on_step: bool | None = None,
        on_epoch: bool | None = None,
        reduce_fx: str | Callable[..., Any] = "mean",
        enable_graph: bool = False,
        sync_dist: bool = False,
        sync_dist_group: Any = None,
        add_dataloader_idx: bool = True,
        batch_size: int | None = None,
        rank_zero_only: bool = False,
    ) -> None:
        """Log every item of a mapping (or a torchmetrics MetricCollection) with the same options. As Lightning,
        a MetricCollection with compute groups hands out its metrics without copying their shared states."""
        groups = getattr(dictionary, "_enable_compute_groups", None)  # (a MetricCollection's)
        kwargs = {} if groups is None else {"keep_base": False, "copy_state": not groups}
        for name, value in dictionary.items(**kwargs):
            self.log(
                name, value, prog_bar, logger, on_step, on_epoch, reduce_fx, enable_graph, sync_dist,
                sync_dist_group, add_dataloader_idx, batch_size, None, rank_zero_only,
            )  # fmt: skip

    def optimizers(self) -> Any:
        """The optimizer(s), wrapped so that .step() goes through the strategy (manual optimization)."""
        self.trainer  # noqa: B018 (raises the not-attached error)
        opts = self._optimizers
        return opts[0] if len(opts) == 1 else opts

    def lr_schedulers(self) -> Any:
        """The scheduler(s) from configure_optimizers, or None."""
        scheds = [c.scheduler for c in self.trainer.lr_scheduler_configs]
        return None if not scheds else scheds[0] if len(scheds) == 1 else scheds

    def manual_backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """Backward through the strategy and precision (scaling, DDP hooks), with the backward hooks."""
        trainer = self.trainer
        trainer.hooks.call("on_before_backward", loss)
        sync = self.__dict__.get("_manual_sync", True)  # False inside optimizer.toggle_model(sync_grad=False)
        trainer.strategy.backward(loss, sync=sync, run=lambda scaled: self.backward(scaled, *args, **kwargs))
        trainer.hooks.call("on_after_backward")

    @property
    def logger(self) -> Any:
        """The Trainer's first logger, or None."""
        return self._trainer.logger if self._trainer is not None else None

    @property
    def loggers(self) -> list[Any]:
        """The Trainer's loggers."""
        return self._trainer.loggers if self._trainer is not None else []

    def all_gather(self, data: Any, group: Any = None, sync_grads: bool = False) -> Any:
        """Every rank's tensors (every rank's of `group`) stacked along a new dim 0, nested collections too;
        with `sync_grads`, gradients flow back to each rank's tensors. Unchanged on one process, as in
        Lightning."""
        from strategies.batch import apply_to_tensors

        comm = self.trainer.strategy.comm
        if comm.world_size == 1:
            return data
        return apply_to_tensors(data, lambda t: comm.all_gather(t, group=group, sync_grads=sync_grads))

    @classmethod
    def load_from_checkpoint(
        cls,
        checkpoint_path: str,
        map_location: Any = None,
        hparams_file: str | None = None,
        strict: bool | None = None,
        weights_only: bool = True,
        **kwargs: Any,
    ) -> Task:
        """A new task of this class built from the checkpoint's hyperparameters (those of `hparams_file`, a
        ``.yaml``/``.yml`` or tags ``.csv``, instead when given; updated by `kwargs`), with its weights loaded (`strict` as in torch's load_state_dict; None: the task's strict_loading);
        `map_location` as torch.load's."""
        from trainer.checkpoint.run import rebuild_task

        return rebuild_task(cls, checkpoint_path, map_location, strict, kwargs, weights_only, hparams_file)

    def load_pretrained(self, path: str, strict: bool = True, key: str | None = "auto") -> None:
        """Load weights from `path` (``torch.save(model.state_dict())``, or a checkpoint's "state_dict"; read as
        plain data). A task built on the meta device (``Trainer.init_module(empty_init=True)`` under fsdp,
        model_parallel or pipeline) gets them at setup, after sharding: only rank 0 reads the file (memory-
        mapped) and the others receive their shards, one tensor at a time. Otherwise they load now."""
        from strategies.checkpoint.checks import check_compatible
        from strategies.large.init import has_meta
        from strategies.large.weights import REMEDY, defer, read_weights

        state = read_weights(path, key)
        if strict:
            check_compatible(self, state, path, REMEDY)
        if has_meta(self):
            defer(self, state, strict, path)
            return
        with torch.no_grad():
            self.load_state_dict(state, strict=strict)

    def print(self, *args: Any, **kwargs: Any) -> None:
        """print() on global rank 0 only; through the progress bar while one draws, so that it stays intact."""
        if self.global_rank != 0:
            return
        trainer = getattr(self, "_trainer", None)
        bar = getattr(trainer, "progress_bar_callback", None) if trainer is not None else None
        if bar is not None and getattr(bar, "is_enabled", False):
            bar.print(*args, **kwargs)
        else:
            print(*args, **kwargs)


add_hook_stubs(
    Task, TASK
)  # on_fit_start, on_train_batch_end, ... as documented no-ops (trainer/loop/hooks.py)


# TorchScript compiles a module's properties unless they are listed here (Lightning lists its own the same
# way): a Task's properties (trainer, device, hparams, ...) read the run, not tensors, so that
# torch.jit.script(task) works as on a LightningModule
Task.__jit_unused_properties__ = sorted(  # type: ignore[attr-defined]
    name
    for klass in Task.__mro__
    if not klass.__module__.startswith("torch.")
    for name, value in vars(klass).items()
    if isinstance(value, property)
)
