"""Trainer: configures a run and hands each stage to the loops (trainer/loop/fit.py, trainer/loop/evaluation.py)."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import os
from collections.abc import Iterator
from typing import Any

import torch

from callbacks.base import Callback
from strategies import resolve_strategy
from strategies.accelerators import by_name as accelerator_name
from strategies.base import Strategy
from strategies.plugins import plugin_type
from tandem_core.errors import ConfigError
from tandem_core.optim import SchedulerConfig
from tandem_core.views import view
from trainer import checkpoint
from trainer import option_notes as notes
from trainer.compiler import from_option as compile_option
from trainer.devices import count as count_devices
from trainer.loader_view import TrainerLoaders
from trainer.loggers import CSVLogger, Logger, TensorBoardLogger, align_versions
from trainer.loggers.dummy import DummyLogger
from trainer.loggers.metrics import MetricStore
from trainer.loggers.reporting import log_metrics, print_results
from trainer.loop import evaluation
from trainer.loop import fit as loop
from trainer.loop.hooks import Hooks
from trainer.loop.session import Session, set_torch_flags
from trainer.loop.state import LoopState
from trainer.options import TrainerConfig
from trainer.profiler import Profiler, make_profiler
from trainer.readback import TrainerReadback
from trainer.task.base import Task
from trainer.task.datamodule import DataModule

_NO_PROFILE = contextlib.nullcontext()


class Trainer(TrainerReadback, TrainerLoaders):
    """Runs a Task: ``Trainer(max_epochs=3, strategy="ddp", devices=2).fit(task)``.

    Keyword names and meanings follow PyTorch Lightning 2.x; trainer/options.py defines them all.
    """

    #: the whole resolved run config (every section) when built from a config (trainer/config/__init__.py), else None
    resolved_config: dict[str, Any] | None = None
    #: environment values the config interpolates -> their ${oc.env:NAME}: never written (trainer/secrets.py)
    config_secrets: dict[str, str] = {}  # noqa: RUF012 (replaced, never mutated)

    def __init__(self, **options: Any) -> None:
        options = notes.env_defaults(type(self).__name__, TrainerConfig.names(), options)  # PL_TRAINER_*
        if "accelerator" in options:  # an accelerator object (Lightning's CPUAccelerator()) as its name
            self._accelerator_given = options["accelerator"]  # trainer.accelerator (trainer/readback.py)
            options["accelerator"] = accelerator_name(options["accelerator"])
        given = TrainerConfig.from_kwargs(**options)
        notes.check_barebones(options)
        notes.check_val_schedule(options)
        notes.note_batch_limits(options)
        cfg = given.effective()
        # as Lightning: an unset max_epochs reads back None until fit picks it (trainer/option_notes.py)
        self._max_epochs_unset = given.max_epochs is None and not given.fast_dev_run
        self._device_spec = (
            cfg.devices
        )  # as given ([1, 3], "0,1", 2): trainer.device_ids (trainer/readback.py)
        # devices as a count from here on ("0,1", [0, 1], -1 read against this machine: trainer/devices.py)
        self.config = cfg = dataclasses.replace(cfg, devices=count_devices(cfg.devices, cfg.accelerator))
        self.default_root_dir = os.path.abspath(os.path.expanduser(cfg.default_root_dir or os.getcwd()))
        set_torch_flags(cfg.deterministic, cfg.benchmark)  # as Lightning does when a Trainer is built
        # (an option passed as None is Lightning's default: not "given", so it conflicts with nothing)
        passed = {name for name, value in options.items() if value is not None}
        self.strategy: Strategy = resolve_strategy(cfg.strategy, vars(cfg), passed)
        notes.warn_unused_gpu(self.strategy)
        self.loggers: list[Logger] = self._make_loggers(cfg.logger)
        if given.fast_dev_run and self._make_loggers(given.logger):  # Lightning's stand-in: calls do nothing
            self.loggers = [DummyLogger()]
        self.callbacks: list[Callback] = self._make_callbacks(cfg.callbacks)
        self.metric_store = MetricStore(self.strategy.comm.reduce)
        self.metric_store.barebones = cfg.barebones  # (self.log is refused)
        self._logged_metrics: dict[str, Any] = {}  # trainer.logged_metrics (trainer/loggers/logged.py)
        self.state = LoopState()
        self.hooks = Hooks(None, [], self)  # the stage's overridden hooks, collected when a stage starts
        self.task: Task | None = None
        self.datamodule: DataModule | None = None
        self.optimizers: list[torch.optim.Optimizer] = []
        self.lr_scheduler_configs: list[SchedulerConfig] = []
        self.loaders: dict[str, list[Any]] = {}  # phase ("train", "val", "test", "predict") -> loaders
        self.loader_sizes: dict[str, list[int | float]] = {}  # phase -> batches per loader (after limits)
        self.loader_iterables: dict[str, Any] = {}  # phase -> its loaders in the form given (val_dataloaders)
        self.profiler = make_profiler(cfg.profiler)
        self.compiler = compile_option(cfg.compile)  # trainer/compiler.py; None: eager
        self.session: Session | None = None  # the running stage's set-up (trainer/loop/session.py)

    __init__.__signature__ = TrainerConfig.signature(  # type: ignore[attr-defined]
        "self",
        {
            "Strategy": Strategy,
            "Logger": Logger,
            "Callback": Callback,
            "Profiler": Profiler,
            "Plugin": plugin_type(),  # a precision plugin, checkpoint IO, cluster environment or layer sync
            "timedelta": datetime.timedelta,
        },  # fmt: skip
    )
    __init__.__doc__ = TrainerConfig.docstring()

    def _make_loggers(self, logger: Any) -> list[Logger]:
        if logger is True:
            return [TensorBoardLogger(self.default_root_dir)]  # save_dir/lightning_logs/version_N
        if logger in (False, None):
            return []
        return align_versions(
            list(logger) if isinstance(logger, (list, tuple)) else [logger]
        )  # loggers sharing a directory share its version_N

    def _make_callbacks(self, callbacks: Any) -> list[Callback]:
        cbs = (
            []
            if callbacks is None
            else list(callbacks)
            if isinstance(callbacks, (list, tuple))
            else [callbacks]
        )
        from callbacks.defaults import default_callbacks  # progress bar, checkpointing, summary

        return default_callbacks(self.config, cbs)

    # ----- entry points --------------------------------------------------------------------------
    def fit(
        self,
        task: Task | None = None,
        train_dataloaders: Any = None,
        val_dataloaders: Any = None,
        datamodule: DataModule | None = None,
        ckpt_path: str | None = None,
        weights_only: bool | None = None,
        *,
        model: Task | None = None,
    ) -> None:
        """Train `task` (Lightning's `model=` too); data from the arguments, a DataModule, or the task.
        `ckpt_path` is read as plain data (torch.load's weights_only); `weights_only=False` (Lightning's
        argument) unpickles a trusted checkpoint whole, which can run code that the file names."""
        if isinstance(train_dataloaders, DataModule):
            datamodule, train_dataloaders = train_dataloaders, None
        task = _one(task, model)
        # self-launching strategies start the workers here (the parent exits); the common path is not
        # wrapped, so that fit stays a few calls above backward (tests/test_trainer.py)
        workers = self.strategy.launch()
        if workers is None:
            with Session(
                self, "fit", task, datamodule, ckpt_path, train_dataloaders, val_dataloaders, weights_only
            ):
                loop.fit(self)
            return

        # in each worker started from this process (a notebook's fork, ddp_spawn); rank 0's results come back
        args = (task, datamodule, ckpt_path, train_dataloaders, val_dataloaders, weights_only)
        workers.run(self, task, functools.partial(_fit_stage, self, *args))

    def validate(self, task: Task | None = None, dataloaders: Any = None, ckpt_path: str | None = None,
                 verbose: bool = True, datamodule: DataModule | None = None, weights_only: bool | None = None,
                 *, model: Task | None = None) -> list[dict[str, float]]:  # fmt: skip
        """Run one validation epoch; returns the logged epoch metrics per loader (printed when verbose)."""
        task = _one(task, model)
        return self._evaluate("validate", task, dataloaders, ckpt_path, datamodule, verbose, weights_only)

    def test(self, task: Task | None = None, dataloaders: Any = None, ckpt_path: str | None = None,
             verbose: bool = True, datamodule: DataModule | None = None, weights_only: bool | None = None,
             *, model: Task | None = None) -> list[dict[str, float]]:  # fmt: skip
        """Run one test epoch; returns the logged epoch metrics per loader (printed when verbose)."""
        return self._evaluate(
            "test", _one(task, model), dataloaders, ckpt_path, datamodule, verbose, weights_only
        )

    def predict(self, task: Task | None = None, dataloaders: Any = None, datamodule: DataModule | None = None,
                return_predictions: bool | None = None, ckpt_path: str | None = None, weights_only: bool | None = None,
                *, model: Task | None = None) -> Any:  # fmt: skip
        """Return predict_step's outputs, one list per loader (flattened when there is one loader)."""
        out = self._evaluate(
            "predict", _one(task, model), dataloaders, ckpt_path, datamodule, False, weights_only
        )
        return None if return_predictions is False else out  # None: Lightning's default, the predictions

    def _evaluate(self, stage: str, task: Task | None, loaders: Any, ckpt_path: str | None,
                  dm: DataModule | None, verbose: bool, weights_only: bool | None) -> Any:  # fmt: skip
        if isinstance(loaders, DataModule):
            dm, loaders = loaders, None

        run = functools.partial(_evaluate_stage, self, stage, task, dm, ckpt_path, loaders, weights_only)
        results = self._launched(task, run)
        if verbose and self.is_global_zero:
            print_results(stage, results)
        return results

    def _launched(self, task: Task | None, stage: Any) -> Any:
        """Run `stage` once the strategy brought this process into the job (a self-launching strategy's
        parent exits inside launch); in a notebook the workers are forked and rank 0's results come back."""
        workers = self.strategy.launch()
        return stage() if workers is None else workers.run(self, task, stage)

    @contextlib.contextmanager
    def init_module(self, empty_init: bool | None = None) -> Iterator[None]:
        """Build the model inside: ``with trainer.init_module(empty_init=True): task = MyTask()``. Tensors made
        inside go where the strategy wants them, in the precision's dtype (the "true" precisions): on the
        device (single, ddp, ...; uninitialized with `empty_init=True`), or with `empty_init=True` under fsdp,
        model_parallel and pipeline on the meta device, each rank then allocating only its shards at setup
        (each module's ``reset_parameters()``, or the weights of load_from_checkpoint / load_pretrained)."""
        with self.strategy.tensor_init_context(empty_init=empty_init):
            yield

    def save_checkpoint(self, path: str, weights_only: bool = False) -> None:
        """Write a checkpoint atomically (rank 0 writes, every rank waits)."""
        checkpoint.save(self, path, weights_only)

    # ----- what callbacks reach through the trainer they receive: callbacks sit below trainer/ and never import
    # it (docs/concepts.md, "Layers"); these run the loop's own machinery for them
    def _to_device(self, batch: Any, dataloader_idx: int = 0) -> Any:
        """`batch` moved as the loop moves it: the batch-transfer hooks, else the strategy (SWA's batch-norm pass)."""
        from trainer.loop.transfer import to_device

        return to_device(self, batch, dataloader_idx)

    def _lr_find(self, task: Task, **options: Any) -> Any:
        """The learning-rate search of LearningRateFinder (trainer/tuner/lr_finder.py)."""
        from trainer.tuner.lr_finder import lr_find

        return lr_find(self, task, **options)

    def _scale_batch_size(self, *args: Any) -> Any:
        """The batch-size search of BatchSizeFinder (trainer/tuner/batch_size.py)."""
        from trainer.tuner.batch_size import scale_batch_size

        return scale_batch_size(self, *args)

    def _log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        """Send a callback's metrics to the loggers under the loop's rules (rank 0, Lightning's step when `step`
        is None, with "epoch" added then; trainer.logged_metrics updated), as Lightning's logger connector."""
        log_metrics(self, metrics, step)

    def profile(self, name: str) -> contextlib.AbstractContextManager[Any]:
        """Time a section of the loop under `name` when a profiler is on (else a no-op context)."""
        return self.profiler.section(name) if self.profiler is not None else _NO_PROFILE

    def print(self, *args: Any, **kwargs: Any) -> None:
        """print() on global rank 0 only."""
        if self.is_global_zero:
            print(*args, **kwargs)

    # ----- Lightning's read-only view of the run ----------------------------------------------------
    current_epoch = view("state.epoch")
    global_step = view("state.global_step")
    stage = view("state.entry")
    sanity_checking = view("state.sanity_checking")

    @property
    def training(self) -> bool:
        """Whether the trainer is in the training loop now."""
        return self.state.phase == "train"

    @property
    def validating(self) -> bool:
        """Whether the trainer is running validation now (not the sanity check)."""
        return self.state.phase == "val" and not self.state.sanity_checking

    @property
    def testing(self) -> bool:
        """Whether the trainer is testing now."""
        return self.state.phase == "test"

    @property
    def predicting(self) -> bool:
        """Whether the trainer is predicting now."""
        return self.state.phase == "predict"

    @property
    def should_stop(self) -> bool:
        """Set to True to end fit after the current step (every rank agrees first)."""
        return self.state.should_stop

    @should_stop.setter
    def should_stop(self, value: bool) -> None:
        self.state.should_stop = bool(value)

    global_rank = view("strategy.comm.rank")
    local_rank = view("strategy.comm.local_rank")
    world_size = view("strategy.comm.world_size")
    is_global_zero = view("strategy.comm.is_global_zero")
    precision = view(
        "strategy.precision",
        'The precision plugin; equal to its name (``trainer.precision == "bf16-mixed"``).',
    )

    max_steps = view("config.max_steps")

    @property
    def accumulate_grad_batches(self) -> int:
        """The number of batches whose gradients add up to one optimizer step."""
        return self.config.accumulate_grad_batches

    @accumulate_grad_batches.setter
    def accumulate_grad_batches(self, k: int) -> None:
        """Set by GradientAccumulationScheduler (as in Lightning); read again at each epoch's start."""
        self.config = dataclasses.replace(self.config, accumulate_grad_batches=k)  # checks k

    model = view("task")

    @property
    def logger(self) -> Logger | None:
        """The first logger, or None without one."""
        return self._loggers[0] if self._loggers else None

    @logger.setter
    def logger(self, logger: Logger | None) -> None:
        """Replace the loggers by this one (None: no logger), as Lightning's setter."""
        self.loggers = [logger] if logger else []

    @property
    def loggers(self) -> list[Logger]:
        """Every logger, in the order given."""
        return self._loggers

    @loggers.setter
    def loggers(self, loggers: list[Logger] | None) -> None:
        self._loggers = list(loggers) if loggers else []

    @property
    def log_dir(self) -> str:
        """As Lightning's: the first logger's version directory for TensorBoard and CSV, its `save_dir` for
        any other (W&B, MLflow, yours); default_root_dir without a logger (or for a tracker with no local
        directory, such as MLflow on a server). ModelCheckpoint's default directory is the logger's own."""
        if not self.loggers:
            return self.default_root_dir
        first = self.loggers[0]
        found = first.log_dir if isinstance(first, (TensorBoardLogger, CSVLogger)) else first.save_dir
        return os.fspath(found) if found is not None else self.default_root_dir

    callback_metrics = view("metric_store.callback_metrics")

    @property
    def progress_bar_metrics(self) -> dict[str, float]:
        """The values shown in the progress bar."""
        return self.metric_store.progress_bar_metrics()

    @property
    def progress_bar_callback(self) -> Any:
        """The ProgressBar among the callbacks, or None."""
        from callbacks.progress import ProgressBar

        return next((cb for cb in self.callbacks if isinstance(cb, ProgressBar)), None)

    @property
    def checkpoint_callbacks(self) -> list[Callback]:
        """Every checkpointing callback (ModelCheckpoint, OnExceptionCheckpoint, ...)."""
        return [cb for cb in self.callbacks if hasattr(cb, "best_model_path")]

    @property
    def checkpoint_callback(self) -> Any:
        """The first ModelCheckpoint, or None."""
        cbs = self.checkpoint_callbacks
        return cbs[0] if cbs else None


def _fit_stage(t: Trainer, task: Task | None, *args: Any) -> None:
    """fit's stage, as workers started from this process run it (a function, so that ddp_spawn pickles it)."""
    with Session(t, "fit", task, *args):
        loop.fit(t)


def _evaluate_stage(t: Trainer, stage: str, task: Task | None, dm: Any, ckpt_path: Any, loaders: Any,
                    weights_only: bool | None) -> Any:  # fmt: skip
    """validate/test/predict's stage (a function, so that ddp_spawn pickles it)."""
    with Session(t, stage, task, dm, ckpt_path, None, loaders, weights_only):
        return evaluation.evaluate(t, stage)


def _one(task: Task | None, model: Task | None) -> Task | None:
    if task is not None and model is not None:
        raise ConfigError("pass the task once: as the first argument or as model=..., not both")
    return task if task is not None else model
