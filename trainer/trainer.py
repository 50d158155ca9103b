"""Trainer: configures a run, calls the hooks, and hands the work to the loops in trainer/loop.py."""

from __future__ import annotations

import functools
import glob
import os
import signal
import sys
import threading
import warnings
from collections.abc import Callable
from typing import Any

import torch

from callbacks.base import Callback
from strategies import resolve_strategy
from trainer import checkpoint as ckpt_io
from trainer import loop
from trainer.data import num_batches, with_worker_seeding
from trainer.datamodule import DataModule
from trainer.errors import CheckpointError, ConfigError, TaskError
from trainer.loggers import Logger, TensorBoardLogger, align_versions
from trainer.metrics import MetricStore, to_floats
from trainer.optim import SchedulerConfig, TaskOptimizer, needs_closure, parse_optimizers, step_schedulers
from trainer.options import TrainerConfig
from trainer.seed import get_rng_state
from trainer.task import Task


class Trainer:
    """Runs a Task: ``Trainer(max_epochs=3, strategy="ddp", devices=2).fit(task)``.

    Keyword names and meanings follow PyTorch Lightning 2.x; see trainer/options.py for the full list.
    """

    #: the whole resolved run config (every section) when built from a config (trainer/config.py), else None
    resolved_config: dict[str, Any] | None = None

    def __init__(self, **options: Any) -> None:
        self.config = cfg = TrainerConfig.from_kwargs(**options).effective()
        self.default_root_dir = os.path.abspath(cfg.default_root_dir or os.getcwd())
        self.strategy = resolve_strategy(
            cfg.strategy, cfg.accelerator, cfg.devices, cfg.precision, num_nodes=cfg.num_nodes
        )
        self.strategy.use_distributed_sampler = cfg.use_distributed_sampler
        self.precision = self.strategy.precision
        self.loggers: list[Logger] = self._make_loggers(cfg.logger)
        self.callbacks: list[Callback] = self._make_callbacks(cfg.callbacks)
        self._metrics = MetricStore(self.strategy.reduce)
        self.logged_metrics: dict[str, float] = {}
        self.task: Task | None = None
        self.datamodule: DataModule | None = None
        self.optimizers: list[torch.optim.Optimizer] = []
        self.lr_scheduler_configs: list[SchedulerConfig] = []
        self._task_optimizers: list[TaskOptimizer] = []
        self._hooks: dict[str, tuple[list[Callable[..., Any]], list[Callable[..., Any]]]] = {}
        # loop position; saved in checkpoints
        self.current_epoch = 0
        self.global_step = 0
        self.batch_in_epoch = 0  # batches of the current epoch already consumed
        self.epoch_finished = False  # the current epoch's training batches are exhausted
        self.val_pending = False  # a mid-epoch validation is due after the current batch
        self.epoch_start_rng: dict[str, Any] | None = None
        self._resume_rng: dict[str, Any] | None = None
        self._last_logged_step = -1
        self.should_stop = False
        self.stop_signal: int | None = None  # set by SIGINT/SIGTERM during fit
        self.sanity_checking = False
        self.stage: str | None = None
        self.train_dataloader: Any = None
        self.val_dataloaders: list[Any] = []
        self.num_training_batches: int | float = 0
        self.num_val_batches: list[int | float] = []

    __init__.__signature__ = TrainerConfig.signature("self")  # type: ignore[attr-defined]
    __init__.__doc__ = TrainerConfig.docstring()

    # ----- construction helpers ------------------------------------------------------------------
    def _make_loggers(self, logger: Any) -> list[Logger]:
        if logger is True:
            return [TensorBoardLogger(self.default_root_dir, name="logs")]
        if logger in (False, None):
            return []
        loggers = list(logger) if isinstance(logger, (list, tuple)) else [logger]
        for lg in loggers:
            if not isinstance(lg, Logger):
                raise ConfigError(
                    f"logger must be True, False, a Logger or a list of Loggers; got {type(lg).__name__}"
                )
        return align_versions(loggers)  # loggers sharing a directory share its version_N

    def _make_callbacks(self, callbacks: Any) -> list[Callback]:
        cbs = (
            []
            if callbacks is None
            else list(callbacks)
            if isinstance(callbacks, (list, tuple))
            else [callbacks]
        )
        for cb in cbs:
            if not isinstance(cb, Callback):
                raise ConfigError(f"callbacks must be Callback instances; got {type(cb).__name__}")
        from callbacks.defaults import default_callbacks  # progress bar, checkpointing, summary

        return default_callbacks(self, cbs)

    # ----- public properties ---------------------------------------------------------------------
    @property
    def logger(self) -> Logger | None:
        return self.loggers[0] if self.loggers else None

    @property
    def log_dir(self) -> str:
        return self.loggers[0].log_dir if self.loggers else self.default_root_dir

    @property
    def callback_metrics(self) -> dict[str, torch.Tensor]:
        return self._metrics.callback_metrics

    @property
    def progress_bar_metrics(self) -> dict[str, float]:
        return self._metrics.progress_bar_metrics()

    @property
    def global_rank(self) -> int:
        return self.strategy.global_rank

    @property
    def world_size(self) -> int:
        return self.strategy.world_size

    @property
    def is_global_zero(self) -> bool:
        return self.strategy.is_global_zero

    @property
    def max_epochs(self) -> int:
        return self.config.max_epochs

    @property
    def max_steps(self) -> int:
        return self.config.max_steps

    @property
    def accumulate_grad_batches(self) -> int:
        return self.config.accumulate_grad_batches

    @property
    def lightning_module(self) -> Task | None:
        return self.task

    @property
    def checkpoint_callbacks(self) -> list[Callback]:
        return [cb for cb in self.callbacks if hasattr(cb, "best_model_path")]

    @property
    def checkpoint_callback(self) -> Any:
        cbs = self.checkpoint_callbacks
        return cbs[0] if cbs else None

    @property
    def estimated_stepping_batches(self) -> int | float:
        """Optimizer steps the whole fit will take (for schedulers such as OneCycleLR)."""
        per_epoch = -(-self.num_training_batches // self.accumulate_grad_batches)
        by_epochs = per_epoch * self.max_epochs if self.max_epochs != -1 else float("inf")
        return min(by_epochs, self.max_steps) if self.max_steps != -1 else by_epochs

    # ----- entry points --------------------------------------------------------------------------
    def fit(
        self,
        task: Task,
        train_dataloaders: Any = None,
        val_dataloaders: Any = None,
        datamodule: DataModule | None = None,
        ckpt_path: str | None = None,
    ) -> None:
        """Train `task`; data from the arguments, a DataModule, or the task's *_dataloader methods."""
        if isinstance(train_dataloaders, DataModule):
            datamodule, train_dataloaders = train_dataloaders, None
        self.strategy.launch(
            self._run, "fit", task, train_dataloaders, val_dataloaders, datamodule, ckpt_path
        )

    def validate(
        self,
        task: Task | None = None,
        dataloaders: Any = None,
        ckpt_path: str | None = None,
        datamodule: DataModule | None = None,
    ) -> list[dict[str, float]]:
        """Run one validation epoch; returns the logged epoch metrics per loader."""
        return self.strategy.launch(self._run, "validate", task, None, dataloaders, datamodule, ckpt_path)

    def test(
        self,
        task: Task | None = None,
        dataloaders: Any = None,
        ckpt_path: str | None = None,
        datamodule: DataModule | None = None,
    ) -> list[dict[str, float]]:
        """Run one test epoch; returns the logged epoch metrics per loader."""
        return self.strategy.launch(self._run, "test", task, None, dataloaders, datamodule, ckpt_path)

    def predict(
        self,
        task: Task | None = None,
        dataloaders: Any = None,
        ckpt_path: str | None = None,
        datamodule: DataModule | None = None,
    ) -> list[Any]:
        """Return predict_step's outputs, one list per loader (flattened when there is one loader)."""
        return self.strategy.launch(self._run, "predict", task, None, dataloaders, datamodule, ckpt_path)

    # ----- the run -------------------------------------------------------------------------------
    def _run(
        self,
        stage: str,
        task: Task | None,
        train: Any,
        evals: Any,
        dm: DataModule | None,
        ckpt_path: str | None,
    ) -> Any:
        task = task if task is not None else self.task
        if not isinstance(task, Task):
            raise TaskError(f"{stage}() needs a trainer.Task, got {type(task).__name__}.")
        self.task, self.stage, self.datamodule = task, stage, dm or self.datamodule
        task._trainer = self
        self._set_deterministic()
        self.strategy.setup_environment()
        handlers = _install_stop_handlers(self) if stage == "fit" else {}
        try:
            self._setup(stage, task, train, evals)
            if ckpt_path is None and stage == "fit" and self.config.resume == "auto":
                ckpt_path = self.strategy.broadcast(self._find_last_checkpoint())  # every rank loads the same
            if ckpt_path is not None:
                self._restore(ckpt_path, stage)
            if stage == "fit":
                return loop.fit(self)
            return loop.evaluate(self, stage)
        except BaseException as e:
            for cb in self.callbacks:
                cb.on_exception(self, task, e)
            self._finalize_loggers("failed")
            raise
        finally:
            for signum, previous in handlers.items():
                signal.signal(signum, previous)
            self._call("teardown", stage)
            if self.datamodule is not None:
                self.datamodule.teardown(stage)
            self.strategy.teardown()

    def _set_deterministic(self) -> None:
        det = self.config.deterministic
        if det is None:
            return
        if det:
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(bool(det), warn_only=det == "warn")

    def _setup(self, stage: str, task: Task, train: Any, evals: Any) -> None:
        dm = self.datamodule
        if dm is not None:
            if self.is_global_zero:
                dm.prepare_data()
            self.strategy.barrier("prepare_data")
            dm.setup(stage)
        self._hooks = self._collect_hooks(task)
        self._call("setup", stage)
        self.strategy.setup(task)
        self._load_data(stage, task, train, evals)
        if stage == "fit":
            self._configure_optimizers(task)

    def _source(self, name: str, task: Task) -> Any:
        for owner in (self.datamodule, task):
            fn = getattr(owner, name, None)
            if callable(fn):
                return fn()
        return None

    def _prepare_loader(self, loader: Any, stage: str) -> Any:
        return with_worker_seeding(self.strategy.process_dataloader(loader, stage))

    def _load_data(self, stage: str, task: Task, train: Any, evals: Any) -> None:
        cfg = self.config
        if stage == "fit":
            train = train if train is not None else self._source("train_dataloader", task)
            if train is None:
                raise TaskError(
                    "fit() needs training data: pass train_dataloaders, a datamodule, or define "
                    "train_dataloader() on the task."
                )
            self.train_dataloader = self._prepare_loader(train, "train")
            self.num_training_batches = num_batches(self.train_dataloader, cfg.limit_train_batches)
        eval_stage = {"fit": "val", "validate": "val"}.get(stage, stage)
        if evals is None:
            evals = self._source(f"{eval_stage}_dataloader", task)
        if evals is None and stage != "fit":
            raise TaskError(
                f"{stage}() needs data: pass dataloaders, a datamodule, or define "
                f"{eval_stage}_dataloader() on the task."
            )
        loaders = [] if evals is None else list(evals) if isinstance(evals, (list, tuple)) else [evals]
        limit = getattr(cfg, f"limit_{'val' if eval_stage == 'val' else eval_stage}_batches")
        self.eval_dataloaders = [self._prepare_loader(dl, eval_stage) for dl in loaders]
        self.eval_num_batches = [num_batches(dl, limit) for dl in self.eval_dataloaders]
        if eval_stage == "val":
            self.val_dataloaders, self.num_val_batches = self.eval_dataloaders, self.eval_num_batches

    def _configure_optimizers(self, task: Task) -> None:
        self.optimizers, self.lr_scheduler_configs = parse_optimizers(task.configure_optimizers())
        if task.automatic_optimization and len(self.optimizers) > 1:
            raise TaskError(
                "automatic optimization supports one optimizer; for several set "
                "self.automatic_optimization = False and step them in training_step."
            )
        closure_opts = [type(o).__name__ for o in self.optimizers if needs_closure(o)]
        if task.automatic_optimization and closure_opts:
            raise TaskError(
                f"{closure_opts[0]} needs a closure that re-evaluates the loss; set "
                "self.automatic_optimization = False and call self.optimizers().step(closure) "
                "in training_step."
            )
        if not task.automatic_optimization and self.config.accumulate_grad_batches > 1:
            raise TaskError(
                "accumulate_grad_batches applies to automatic optimization only; with "
                "self.automatic_optimization = False step the optimizer every k batches yourself."
            )
        self._task_optimizers = [TaskOptimizer(o, self) for o in self.optimizers]

    # ----- hooks ---------------------------------------------------------------------------------
    def _collect_hooks(
        self, task: Task
    ) -> dict[str, tuple[list[Callable[..., Any]], list[Callable[..., Any]]]]:
        """For each hook name, the overriding methods: (plain callbacks + task, monitoring callbacks)."""
        hooks: dict[str, tuple[list[Callable[..., Any]], list[Callable[..., Any]]]] = {}
        for name in [n for n in dir(Callback) if n.startswith("on_") or n in ("setup", "teardown")]:
            groups: tuple[list[Callable[..., Any]], list[Callable[..., Any]]] = ([], [])
            for cb in self.callbacks:
                if getattr(type(cb), name) is not getattr(Callback, name):
                    groups[cb.monitoring].append(functools.partial(getattr(cb, name), self, task))
            if hasattr(Task, name) and getattr(type(task), name) is not getattr(Task, name):
                groups[0].append(getattr(task, name))
            if groups[0] or groups[1]:
                hooks[name] = groups
        return hooks

    def _call(self, name: str, *args: Any, monitoring: bool | None = None) -> Any:
        """Call every override of hook `name`: plain callbacks, the task, then monitoring callbacks
        (checkpointing, early stopping), or only one side when `monitoring` is given.
        Returns the last non-None result (the task's -1 from on_train_batch_start)."""
        groups = self._hooks.get(name)
        if groups is None:
            return None
        out = None
        for i, fns in enumerate(groups):
            if monitoring is None or monitoring == bool(i):
                for fn in fns:
                    result = fn(*args)
                    if result is not None:
                        out = result
        return out

    def _optimizer_step(
        self, optimizer: torch.optim.Optimizer, closure: Callable[[], Any] | None = None
    ) -> Any:
        before = (
            (lambda opt: self._call("on_before_optimizer_step", opt))
            if "on_before_optimizer_step" in self._hooks
            else None
        )
        return self.strategy.optimizer_step(
            optimizer, closure, before, self.config.gradient_clip_val, self.config.gradient_clip_algorithm
        )

    # ----- logging -------------------------------------------------------------------------------
    def _log(self, metrics: dict[str, torch.Tensor], step: int | None = None) -> None:
        """Send metrics to the loggers (rank 0); this is where tensors become floats."""
        if not metrics:
            return
        values = {k: float(v) for k, v in to_floats(metrics).items()}  # one host copy per device
        self.logged_metrics.update(values)
        if self.loggers and self.is_global_zero and not self.sanity_checking:
            values["epoch"] = float(self.current_epoch)
            for lg in self.loggers:
                lg.log_metrics(values, self.global_step if step is None else step)

    def _finalize_loggers(self, status: str) -> None:
        if not self.is_global_zero:
            return
        for lg in self.loggers:
            if self.task is not None and self.task.hparams:
                final = {k: float(v) for k, v in self.callback_metrics.items()}
                lg.log_hyperparams(dict(self.task.hparams), final)
            lg.finalize(status)

    # ----- checkpoints ---------------------------------------------------------------------------
    def save_checkpoint(self, path: str, weights_only: bool = False) -> None:
        """Write a checkpoint atomically (rank 0 writes, every rank waits)."""
        task = self.task
        if task is None:
            raise CheckpointError("save_checkpoint needs a task: call it during or after fit().")
        ckpt: dict[str, Any] = {
            "tandem_version": 1,
            "task_class": f"{type(task).__module__}.{type(task).__qualname__}",
            "state_dict": task.state_dict(),
            "hyper_parameters": dict(task.hparams),
            "config": self.resolved_config,  # the run config that built this trainer (trainer/config.py)
            "epoch": self.current_epoch,
            "global_step": self.global_step,
        }
        if not weights_only:
            ckpt.update(
                optimizer_states=[o.state_dict() for o in self.optimizers],
                lr_schedulers=[c.scheduler.state_dict() for c in self.lr_scheduler_configs],
                strategy=self.strategy.state_dict(),
                loop={
                    "epoch": self.current_epoch,
                    "global_step": self.global_step,
                    "batch_in_epoch": self.batch_in_epoch,
                    "epoch_finished": self.epoch_finished,
                    "val_pending": self.val_pending,
                    # what a ReduceLROnPlateau needs when resuming from inside an epoch's end
                    "callback_metrics": {k: v.detach().cpu() for k, v in self.callback_metrics.items()},
                    "epoch_start_rng": self.strategy.gather_object(self.epoch_start_rng),
                },
                rng=self.strategy.gather_object(get_rng_state()),  # every rank's, so each resumes its own
                # inside an accumulation window the gradients so far are state too (each rank's own)
                accumulated_grads=self.strategy.gather_object(_grads(task)) if self._mid_window() else None,
                callbacks={cb.state_key: cb.state_dict() for cb in self.callbacks},
            )
            if self.datamodule is not None:
                ckpt["datamodule"] = self.datamodule.state_dict()
            self._call("on_save_checkpoint", ckpt)
        if self.is_global_zero:
            ckpt_io.atomic_save(ckpt, path)
        self.strategy.barrier("save_checkpoint")

    def _find_last_checkpoint(self) -> str | None:
        """For resume='auto': the checkpoint callbacks' last file, else the newest last.ckpt under
        default_root_dir (log versions change between restarts), else None for a fresh start."""
        last = self._callback_last_checkpoint()
        if last is not None:
            return last
        found = glob.glob(os.path.join(self.default_root_dir, "**", "last.ckpt"), recursive=True)
        return max(found, key=os.path.getmtime) if found else None

    def _callback_last_checkpoint(self) -> str | None:
        """The last.ckpt that a checkpoint callback knows of, if it exists."""
        for cb in self.checkpoint_callbacks:
            last = getattr(cb, "last_checkpoint_path", lambda: None)()
            if last and os.path.isfile(last):
                return last
        return None

    def _stop_checkpoint_path(self) -> str:
        """Where a SIGINT/SIGTERM stop writes: the checkpoint callback's last.ckpt, or <root>/checkpoints."""
        for cb in self.checkpoint_callbacks:
            dirpath = getattr(cb, "dirpath", None)
            if dirpath:
                return os.path.join(dirpath, "last.ckpt")
        return os.path.join(self.default_root_dir, "checkpoints", "last.ckpt")

    def _mid_window(self) -> bool:
        """True between the micro-batches of one optimizer step (automatic optimization)."""
        k = self.config.accumulate_grad_batches
        auto = self.task is not None and self.task.automatic_optimization
        return auto and k > 1 and not self.epoch_finished and self.batch_in_epoch % k != 0

    def _resolve_ckpt_path(self, path: str) -> str:
        if path == "best":  # Lightning's shorthand: the best model of the checkpoint callback
            for cb in self.checkpoint_callbacks:
                best = getattr(cb, "best_model_path", "")
                if best and os.path.isfile(best):
                    return best
            raise CheckpointError(
                "ckpt_path='best' found no best checkpoint; enable ModelCheckpoint(monitor=...) "
                "in this Trainer's fit, or pass a file path."
            )
        if path != "last":
            return path
        last = self._callback_last_checkpoint()
        if last is not None:
            return last
        raise CheckpointError(
            "ckpt_path='last' found no last checkpoint; enable ModelCheckpoint(save_last=True) "
            "in the run you resume, or pass a file path."
        )

    def _restore(self, path: str, stage: str) -> None:
        path = self._resolve_ckpt_path(path)
        task = self.task
        assert task is not None
        ckpt = ckpt_io.load(path)
        ckpt_io.check_compatible(task, ckpt["state_dict"], path)
        task.load_state_dict(ckpt["state_dict"])
        if stage == "fit" and "loop" in ckpt:
            if len(ckpt["optimizer_states"]) != len(self.optimizers):
                raise CheckpointError(
                    f"checkpoint {path!r} has {len(ckpt['optimizer_states'])} optimizer(s) but "
                    f"configure_optimizers returned {len(self.optimizers)}."
                )
            for opt, state in zip(self.optimizers, ckpt["optimizer_states"]):
                opt.load_state_dict(state)
            for cfg, state in zip(self.lr_scheduler_configs, ckpt["lr_schedulers"]):
                cfg.scheduler.load_state_dict(state)
            self.strategy.load_state_dict(ckpt.get("strategy", {}))
            lp = ckpt["loop"]
            self.current_epoch, self.global_step = lp["epoch"], lp["global_step"]
            self.batch_in_epoch, self.epoch_finished = lp["batch_in_epoch"], lp["epoch_finished"]
            self.val_pending = lp.get("val_pending", False)
            self.epoch_start_rng = _own(lp["epoch_start_rng"], self.global_rank)
            self._resume_rng = _own(ckpt["rng"], self.global_rank)
            if ckpt.get("accumulated_grads") is not None:
                for p, g in zip(task.parameters(), _own(ckpt["accumulated_grads"], self.global_rank)):
                    p.grad = None if g is None else g.to(p.device)
            if self.epoch_finished:  # saved during the epoch's end, before its schedulers stepped: finish it
                if task.automatic_optimization:
                    self._metrics.callback_metrics.update(lp.get("callback_metrics", {}))
                    # the fresh optimizer has not stepped yet, so torch's order warning does not apply
                    with warnings.catch_warnings():
                        warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step")
                        step_schedulers(self, "epoch")
                self.current_epoch, self.batch_in_epoch, self.epoch_finished = (
                    self.current_epoch + 1,
                    0,
                    False,
                )
            for cb in self.callbacks:
                if cb.state_key in ckpt.get("callbacks", {}):
                    cb.load_state_dict(ckpt["callbacks"][cb.state_key])
            if self.datamodule is not None and "datamodule" in ckpt:
                self.datamodule.load_state_dict(ckpt["datamodule"])
        self._call("on_load_checkpoint", ckpt)

    def print(self, *args: Any, **kwargs: Any) -> None:
        """print() on global rank 0 only."""
        if self.is_global_zero:
            print(*args, **kwargs)


def _grads(task: Task) -> list[torch.Tensor | None]:
    return [None if p.grad is None else p.grad.detach().cpu().clone() for p in task.parameters()]


def _own(states: Any, rank: int) -> Any:
    """This rank's entry of a per-rank list saved in a checkpoint (older or 1-process files hold one state)."""
    if isinstance(states, list):
        return states[rank] if rank < len(states) else states[0]
    return states


STOP_GRACE_S = 20.0  # after SIGINT/SIGTERM, a rank that reaches no step boundary in this time exits


def _stuck_exit(rank: int, signum: int) -> None:
    """The rank did not reach a step boundary after a stop signal: show where it is stuck, then exit."""
    import faulthandler

    print(
        f"[tandem] rank {rank} did not reach a step boundary within {STOP_GRACE_S:g} s of "
        f"{signal.Signals(signum).name}; exiting without a checkpoint. It is stuck here:",
        file=sys.stderr,
        flush=True,
    )
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    os._exit(128 + int(signum))


def _install_stop_handlers(trainer: Trainer) -> dict[int, Any]:
    """SIGINT/SIGTERM ask the loop to stop at the next agreed step (checkpoint first); a second one forces."""
    if threading.current_thread() is not threading.main_thread():
        return {}

    def handler(signum: int, frame: Any) -> None:
        if trainer.stop_signal is not None:  # asked twice: stop now
            raise KeyboardInterrupt
        trainer.stop_signal = signum
        print(
            f"[tandem] rank {trainer.global_rank} received {signal.Signals(signum).name}: stopping at the next "
            "step boundary (send it again to stop at once)",
            file=sys.stderr,
            flush=True,
        )
        watchdog = threading.Timer(STOP_GRACE_S, _stuck_exit, args=(trainer.global_rank, signum))
        watchdog.daemon = True
        watchdog.start()

    previous = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        previous[signum] = signal.getsignal(signum)
        signal.signal(signum, handler)
    return previous
