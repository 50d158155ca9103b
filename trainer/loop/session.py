"""Session: what surrounds one stage's loop: attach the task, collect hooks, set up data and optimizers,
restore a checkpoint, handle stop signals; afterwards tear everything down (also after an error)."""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from strategies.data.indices import track_indices
from strategies.data.reinit import recording_init_args
from strategies.memory.plan import check_fits
from tandem_core.errors import NoDataError, TaskError, TaskTypeError
from tandem_core.hooks import overrides
from trainer import checkpoint
from trainer.compiler import RecompileWatch, unwrap_compiled
from trainer.compiler import apply as apply_compiler
from trainer.loggers import agree_versions
from trainer.loggers.reporting import finalize_loggers
from trainer.loop.combined import combine_train, eval_list, is_collection, one_loader, prepare_eval, stateful
from trainer.loop.data import num_batches, shutdown_workers, unshuffled, with_worker_seeding
from trainer.loop.hooks import Hooks, run_as
from trainer.loop.loader_checks import check_loader
from trainer.loop.optim import check_optimizers, parse_optimizers
from trainer.loop.signals import StopSignals, exit_code
from trainer.loop.task_optimizer import TaskOptimizer
from trainer.loop.transfer import transfer_owners
from trainer.option_notes import resolve_max_epochs
from trainer.profiler import action_key
from trainer.states import TrainerFn, TrainerStatus
from trainer.task.base import Task
from trainer.utilities.combined_loader import CombinedLoader
from trainer.utilities.parsing import clean_namespace

if TYPE_CHECKING:
    from trainer.task.datamodule import DataModule
    from trainer.trainer import Trainer

PHASE = {"fit": "val", "validate": "val", "test": "test", "predict": "predict"}  # a stage's evaluation phase
LIMIT = {"train": "limit_train_batches", "val": "limit_val_batches", "test": "limit_test_batches",
         "predict": "limit_predict_batches"}  # fmt: skip


class Session:
    """``with Session(trainer, "fit", task, datamodule, ckpt_path, train, evals): loop.fit(trainer)``;
    `weights_only=False` reads the checkpoint to restore with a full unpickler (Lightning's argument)."""

    def __init__(
        self, trainer: Trainer, stage: str, task: Task | None, dm: DataModule | None, ckpt_path: str | None,
        train: Any, evals: Any, weights_only: bool | None = None,
    ) -> None:  # fmt: skip
        self.t, self.stage, self.ckpt_path, self.train, self.evals = trainer, stage, ckpt_path, train, evals
        self.weights_only = weights_only is not False
        self.task_given = task is not None  # Lightning's "model provided": ckpt_path=None then loads nothing
        task = task if task is not None else trainer.task
        task, self.compiler = unwrap_compiled(task, trainer.compiler)  # fit(torch.compile(task)) as Lightning
        if not isinstance(task, Task):
            raise TaskTypeError(f"{stage}() needs a trainer.Task, got {type(task).__name__}.")
        self.task = task
        self.dm = dm or trainer.datamodule
        self.signals = StopSignals(trainer, fit=stage == "fit")
        self.uncompile: Callable[[], None] | None = None
        self.recompiles: RecompileWatch | None = None
        self.cudagraphs = False  # the compiled steps replay CUDA graphs (set up with the task)
        self.restoring: checkpoint.Restoring | None = None
        self.train_iterator: Any = None  # the last epoch's, kept until the next starts (its workers end then)
        self.eval_batches: dict[tuple[str, int], int] = {}  # (phase, loader) -> batches run since it loaded
        # time.monotonic() of fit's last validation (a time-based val_check_interval); the epoch it last asked
        # for its validation loaders at (loop/val_schedule.py); whether it said a stop waits for min_epochs/steps
        self.last_val_time, self.val_loaded_epoch, self.min_noted = 0.0, float("-inf"), False

    def __enter__(self) -> Session:
        t, task, stage = self.t, self.task, self.stage
        t.task, t.datamodule, t.state.entry, t.session = task, self.dm, stage, self
        t.state.status = TrainerStatus.RUNNING
        if stage == "fit":
            resolve_max_epochs(t)  # an unset max_epochs becomes 1000 or -1 now, as in Lightning
        task._trainer = t
        if task.hparams:  # as Lightning at each stage's start: unpicklable values are dropped, said
            clean_namespace(task.hparams)
        if self.dm is not None:
            self.dm.trainer = t
        self.anomaly = torch.is_anomaly_enabled()
        if stage == "fit" and t.config.detect_anomaly:
            torch.autograd.set_detect_anomaly(True)
        if t.profiler is not None:  # named after the stage (and the local rank, under several processes)
            rank = t.local_rank if t.world_size > 1 else None
            t.profiler.setup(stage=stage, local_rank=rank)  # (the log_dir is known when the stage ends)
            t.profiler.attach(t)
        if overrides(task, "configure_callbacks"):  # every stage, first of all (as Lightning)
            t.callbacks = merge_callbacks(t.callbacks, task.configure_callbacks())
        t.hooks = Hooks(task, t.callbacks, t, t.profiler)  # only the overridden hooks, once per stage
        for cb in t.callbacks:  # as Lightning: a callback's self.log(...) is the task's
            cb.log, cb.log_dict = task.log, task.log_dict
        t.hooks.transfer = transfer_owners(task, self.dm)
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
        agree_versions(t.loggers, t.strategy.comm)  # every rank's log_dir is rank 0's claimed version_N
        owners = [o for o in (dm, task) if o is not None and overrides(o, "prepare_data")]
        if owners:
            for owner in owners:  # once per node, or once in all with prepare_data_per_node=False
                if (t.local_rank if getattr(owner, "prepare_data_per_node", True) else t.global_rank) == 0:
                    with t.profile(action_key(owner, "prepare_data")):
                        owner.prepare_data()
            t.strategy.comm.barrier("prepare_data")
        if dm is not None:
            with t.profile(action_key(dm, "setup")):
                dm.setup(stage=TrainerFn(stage))  # by keyword, and a TrainerFn, as Lightning calls it
        t.hooks.call("setup", stage=TrainerFn(stage))
        if "configure_model" in t.hooks.custom:  # under the strategy's init context, as in Lightning
            with t.strategy.tensor_init_context():
                run_as(t, "configure_model", task.configure_model)
        t.strategy.connect(task)
        path = self.ckpt_path
        if t._ckpt_user_managed:  # `trainer.ckpt_path = ...` (Lightning's stateful form): the argument wins
            if path is not None:
                warnings.warn(
                    f"`trainer.ckpt_path = {t._ckpt_path!r}` was set but {stage}(ckpt_path={path!r}) was passed; "
                    "the latter is loaded.",
                    stacklevel=2,
                )
                t._ckpt_user_managed = False
            else:
                path = t._ckpt_path
        if path is None and stage == "fit" and t.config.resume == "auto":
            path = t.strategy.comm.broadcast(checkpoint.find_last(t))  # every rank loads the same file
        path = checkpoint.choose(t, stage, path, self.task_given)  # "best", "last", None: Lightning's reading
        if path is not None:  # a task built on meta needs no reset_parameters for what the file restores
            checkpoint.expect_restore(t, path, self.weights_only)
        t.strategy.setup(task)
        t.loaders, t.loader_sizes, t.loader_iterables = {}, {}, {}
        self._check_data()
        # the weights and callback states now; for fit the optimizer and loop states after on_fit_start
        self.restoring = (
            checkpoint.prepare_restore(t, path, stage, self.weights_only) if path is not None else None
        )
        t._ckpt_path = self.restoring.path if self.restoring is not None else None  # "best"/"last" resolved
        if stage == "fit":
            t.optimizers, t.lr_scheduler_configs = parse_optimizers(
                run_as(t, "configure_optimizers", task.configure_optimizers), task.automatic_optimization
            )
            check_optimizers(t.optimizers, task.automatic_optimization, t.config.accumulate_grad_batches,
                             task, t.lr_scheduler_configs)  # fmt: skip
            if not task.automatic_optimization and t.config.gradient_clip_val:  # Lightning refuses it too
                raise TaskError(
                    "gradient_clip_val clips under automatic optimization only; with "
                    "self.automatic_optimization = False call self.clip_gradients(opt, ...) before opt.step()."
                )
            task._optimizers = [TaskOptimizer(o, t) for o in t.optimizers]
            # a warning when the states alone cannot fit the device (strategies/memory/plan.py)
            check_fits(t.strategy, task, t.optimizers, t.config.devices)
        if self.compiler is not None:  # after the strategy moved, wrapped or sharded the plain module
            self.uncompile = t.strategy.compile(
                task, functools.partial(apply_compiler, compiler=self.compiler)
            )
            self.recompiles = RecompileWatch()
        # CUDA graphs: step values kept across steps are copies, and each step marks its start (loop/closure.py)
        self.cudagraphs = self.compiler is not None and self.compiler.cudagraphs
        t.metric_store.keep_copies = self.cudagraphs

    @property
    def val_enabled(self) -> bool:
        """Whether fit validates: validation_step defined, limit_val_batches not 0, and data to validate on."""
        return (
            self.stage == "fit"
            and overrides(self.task, "validation_step")
            and self.t.config.limit_val_batches != 0
            and (self.evals is not None or self._has_source("val_dataloader"))
        )

    def load(self, phase: str) -> list[Any]:
        """`phase`'s loaders, asked for once, when the loop first needs them (as Lightning asks)."""
        t = self.t
        if phase not in t.loaders:
            self.eval_batches = {k: n for k, n in self.eval_batches.items() if k[0] != phase}
            if phase == "train":
                self._load_train()
            else:
                self._load_eval(phase)
        return t.loaders[phase]

    def reload(self, *phases: str) -> None:
        """Ask the task's or datamodule's *_dataloader() again for `phases` (all those loaded when none given)."""
        for phase in phases or list(self.t.loaders):
            for held in (self.t.loaders, self.t.loader_sizes, self.t.loader_iterables):
                held.pop(phase, None)
            self.load(phase)

    def _check_data(self) -> None:
        """Refuse at once a stage without data (the loaders themselves are asked for later)."""
        stage = self.stage
        if stage == "fit" and self.train is None and not self._has_source("train_dataloader"):
            raise NoDataError(
                "fit() needs training data: pass train_dataloaders, a datamodule, or define "
                "train_dataloader() on the task."
            )
        phase = PHASE[stage]
        if stage != "fit" and self.evals is None and not self._has_source(f"{phase}_dataloader"):
            raise NoDataError(
                f"{stage}() needs data: pass dataloaders, a datamodule, or define {phase}_dataloader() on the task."
            )
        step = {"val": "validation_step", "test": "test_step"}.get(phase)
        if stage != "fit" and step is not None and not overrides(self.task, step):
            raise TaskError(
                f"{stage}() needs {type(self.task).__name__}.{step}(self, batch, batch_idx); define it."
            )

    def _load_train(self) -> None:
        train = self.train if self.train is not None else self._source("train_dataloader")
        if train is None:
            raise NoDataError("train_dataloader() returned None; return a DataLoader.")
        # several loaders: one CombinedLoader ("max_size_cycle"), as Lightning; a stateful loader too (its state
        # is saved at the batch the loop is at, see loop/combined.py); its batches are the loader's own
        if is_collection(train) or stateful(train):
            t = self.t
            prepare = functools.partial(self._prepare, "train")
            combined = combine_train(train, prepare, t.config.limit_train_batches)
            t.loaders["train"], t.loader_sizes["train"] = [combined], [combined.num_batches()]
            return
        self._add("train", [train])

    def _load_eval(self, phase: str) -> None:
        if self.stage == "fit" and not self.val_enabled:  # Lightning runs no validation then
            self._add(phase, [])
            return
        evals = self.evals if self.evals is not None else self._source(f"{phase}_dataloader")
        if evals is None and self.stage != "fit":  # validate/test/predict asked for data it does not get
            raise NoDataError(f"{phase}_dataloader() returned None; return a DataLoader.")
        if evals is None:
            loaders = []
        else:  # loaders in a dict, list or nested: flattened, each a dataloader_idx (loop/combined.py)
            loaders = eval_list(evals, phase)
        if len(loaders) == 1 and isinstance(loaders[0], CombinedLoader):  # combined batches, as one loader
            limit = getattr(self.t.config, LIMIT[phase])
            n = prepare_eval(loaders[0], functools.partial(self._prepare, phase), limit)
            self.t.loaders[phase], self.t.loader_sizes[phase] = loaders, [n]
            self.t.loader_iterables[phase] = loaders[0].iterables
            return
        self._add(phase, loaders)
        self.t.loader_iterables[phase] = _as_given(evals, self.t.loaders[phase])

    def _prepare(self, phase: str, loader: Any) -> Any:
        """One loader made ready for `phase`: unshuffled for overfit_batches, sharded, its workers seeded."""
        t = self.t
        check_loader(self, phase, loader)  # iterable (a TypeError naming its origin), its workers (warnings)
        if t.config.overfit_batches and (phase == "train" or (phase == "val" and self.stage == "fit")):
            loader = unshuffled(loader, phase)  # the same first batches every epoch: in order, as Lightning
        loader = with_worker_seeding(t.strategy.process_dataloader(loader, phase))
        if phase == "predict":  # each batch's sample indices, for prediction writers (as Lightning)
            loader = track_indices(loader)
        return loader

    def _add(self, phase: str, loaders: list[Any]) -> None:
        t = self.t
        prepared = [self._prepare(phase, dl) for dl in loaders]
        limit = getattr(t.config, LIMIT[phase])
        t.loaders[phase], t.loader_sizes[phase] = prepared, [num_batches(dl, limit) for dl in prepared]

    def _source(self, name: str) -> Any:
        for owner in (self.dm, self.task):
            fn = _defined(owner, name)
            if fn is not None:
                with recording_init_args(), self.t.profile(action_key(owner, name)):
                    return fn()  # (recorded: a DataLoader subclass can be rebuilt with a sampler)
        return None

    def _has_source(self, name: str) -> bool:
        return any(_defined(owner, name) is not None for owner in (self.dm, self.task))

    def __exit__(self, kind: Any, error: BaseException | None, tb: Any) -> None:
        t = self.t
        t.metric_store.fx = None  # no step runs any more
        stopped = error is not None or t.state.stop_signal is not None
        if stopped:  # a finished run stays RUNNING through its teardown hooks (as Lightning's)
            t.state.status = TrainerStatus.INTERRUPTED
        try:
            if error is not None:
                t.hooks.call("on_exception", error)
                if self.dm is not None and overrides(self.dm, "on_exception"):
                    self.dm.on_exception(error)
                t.strategy.on_exception(error)
                finalize_loggers(t, "failed")
        finally:
            if self.signals is not None:
                self.signals.restore()
            torch.autograd.set_detect_anomaly(self.anomaly)
            if (
                t.profiler is not None
            ):  # every rank ends its torch.profiler (and writes its trace), and reports
                if t.profiler.filename and not t.profiler.dirpath:  # Lightning's default: the run's log_dir
                    t.profiler.dirpath = t.log_dir
                t.profiler.describe()
            if self.uncompile is not None:
                if error is None and self.recompiles is not None:
                    self.recompiles.check(f"by the end of {self.stage}")
                self.uncompile()
            try:
                if error is None:  # as Lightning: after an exception only on_exception runs, not teardown
                    if self.dm is not None:
                        with t.profile(action_key(self.dm, "teardown")):
                            self.dm.teardown(stage=TrainerFn(self.stage))
                    t.hooks.call("teardown", stage=TrainerFn(self.stage))
                    finalize_loggers(t, "success")  # as Lightning: after the teardown hooks, in every stage
            finally:
                if not stopped:
                    t.state.status = TrainerStatus.FINISHED
                self.train_iterator = None  # (its workers end now, with the stage)
                shutdown_workers([loader for loaders in t.loaders.values() for loader in loaders])
                try:
                    t.strategy.teardown()
                finally:
                    checkpoint.finish(t, error)
        code = exit_code(t, error)  # an agreed Ctrl-C stop: the hooks had its KeyboardInterrupt; exit 130
        if code is not None:
            raise SystemExit(code) from error


def _defined(owner: Any, name: str) -> Any:
    """`owner`'s own `name` method (a *_dataloader), not Tandem's default that only raises, or None."""
    fn = getattr(owner, name, None) if owner is not None else None
    return fn if callable(fn) and not getattr(fn, "_tandem_default", False) else None


def merge_callbacks(callbacks: list[Any], extra: Any) -> list[Any]:
    """configure_callbacks(): its callbacks replace the Trainer's of the same type; checkpointing stays last."""
    from callbacks.base import Callback, check_state_keys

    extra = list(extra) if isinstance(extra, (list, tuple)) else [extra] if extra else []
    for cb in extra:
        if not isinstance(cb, Callback):
            raise TaskError(f"configure_callbacks returned {type(cb).__name__}; return Callback instances.")
    kinds = {type(cb) for cb in extra}
    merged = [cb for cb in callbacks if type(cb) not in kinds] + extra
    check_state_keys(merged)  # two stateful callbacks under one key: refused (as in Lightning)
    return [cb for cb in merged if not hasattr(cb, "best_model_path")] + [
        cb for cb in merged if hasattr(cb, "best_model_path")
    ]


def set_torch_flags(det: bool | str | None, bench: bool | None) -> None:
    """deterministic and benchmark, as Lightning sets them (benchmark None: off when deterministic)."""
    if det is not None:
        if det:
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(bool(det), warn_only=det == "warn")
    if bench is None and det:
        bench = False
    if bench is not None:
        torch.backends.cudnn.benchmark = bench


def _as_given(evals: Any, prepared: list[Any]) -> Any:
    """The prepared loaders in the form they were given (one loader, or its list, dict, nested collection), as
    Lightning's trainer.val_dataloaders returns them; None without loaders."""
    if not prepared:
        return None
    if is_collection(evals) and not isinstance(evals, CombinedLoader):
        combined = CombinedLoader(evals, "sequential")
        combined.flattened = prepared
        return combined.iterables
    return prepared[0] if one_loader(evals) else prepared
