"""ModelCheckpoint: save checkpoints by epoch, step or time; keep the top k by a monitored metric."""

from __future__ import annotations

import os
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal, get_type_hints

import torch

from callbacks import checkpoint_state
from callbacks.base import Checkpoint
from callbacks.checkpoint_files import link_last, remove_file
from callbacks.checkpoint_names import (
    format_name,
    newest_lasts,
    parse_template,
    template_values,
    unique_path,
    version_checkpoint_dirs,
)
from callbacks.checkpoint_schedule import SaveSchedule, waits_for_validation
from callbacks.monitor import Monitor, at_train_epoch_end, fitting, rank_zero_decides
from tandem_core.errors import ConfigError
from tandem_core.fileio import is_url, refuse_url

if TYPE_CHECKING:
    from trainer.task.base import Task
    from trainer.trainer import Trainer


class ModelCheckpoint(checkpoint_state.BestKYaml, Checkpoint):
    """Saves checkpoints (atomically, through ``trainer.save_checkpoint``) into `dirpath`.

    With `monitor`, keeps the `save_top_k` best by that metric (`mode` "min" or "max") and deletes the files
    that fall out; without it, keeps the latest (save_top_k=1) or all (-1). `filename` is a template over
    ``epoch``, ``step`` and logged keys: ``"{epoch}-{val/loss:.3f}"`` gives ``epoch=3-val_loss=0.123.ckpt``
    ('/' in a key becomes '_'). `save_last` also keeps ``last.ckpt`` for ``fit(ckpt_path="last")``, written
    when Lightning writes it: with every step- or time-triggered save, at an epoch's save point only when a
    top-k checkpoint was saved at that step, and at the end of training only if nothing was saved at all;
    ``save_last="link"`` makes it a symbolic link to the newest checkpoint instead of a copy.
    Saving happens every `every_n_epochs` epochs (default 1), or every `every_n_train_steps` optimizer steps,
    or every `train_time_interval`. The default `dirpath` is ``<logger's log_dir>/checkpoints``, or
    ``<default_root_dir>/checkpoints`` without a logger. Example::

        ModelCheckpoint(monitor="val/acc", mode="max", save_top_k=3, save_last=True)
    """

    monitoring = True  # runs after the task's hooks (and, as the Trainer orders them, after early stopping)
    CHECKPOINT_EQUALS_CHAR = "="
    CHECKPOINT_NAME_LAST = "last"
    FILE_EXTENSION = ".ckpt"

    def __init__(
        self,
        dirpath: str | os.PathLike[str] | None = None,
        filename: str | None = None,
        monitor: str | None = None,
        verbose: bool = False,
        save_last: bool | Literal["link"] | None = None,
        save_top_k: int = 1,
        save_on_exception: bool = False,
        save_weights_only: bool = False,
        mode: str = "min",
        auto_insert_metric_name: bool = True,
        every_n_train_steps: int | None = None,
        train_time_interval: timedelta | float | None = None,
        every_n_epochs: int | None = None,
        save_on_train_epoch_end: bool | None = None,
        enable_version_counter: bool = True,
    ) -> None:
        self._monitor = Monitor("ModelCheckpoint", monitor, mode)
        if not isinstance(save_top_k, int) or save_top_k < -1:
            raise ConfigError(f"ModelCheckpoint(save_top_k=...) must be an int >= -1, got {save_top_k!r}.")
        if monitor is None and save_top_k not in (-1, 0, 1):
            raise ConfigError(
                f"ModelCheckpoint(save_top_k={save_top_k}) needs monitor=...: without a metric "
                "there is no 'top'; use save_top_k=-1 to keep every checkpoint."
            )
        if save_last not in (None, True, False, "link"):
            raise ConfigError(
                f"ModelCheckpoint(save_last=...) takes True, False, None or 'link'; got {save_last!r}."
            )
        self._schedule = SaveSchedule(every_n_train_steps, train_time_interval, every_n_epochs)
        # a URL is kept as given and refused at setup, where Lightning refuses one with save_last='link'
        self.dirpath = (
            dirpath if dirpath is None or is_url(dirpath) else os.path.abspath(os.path.expanduser(dirpath))
        )
        self._default_dirpath = dirpath is None
        self.filename = filename
        self.verbose = verbose
        self.save_last = save_last
        self.save_top_k = save_top_k
        self.save_on_exception = save_on_exception
        self.save_weights_only = save_weights_only
        self.auto_insert_metric_name = auto_insert_metric_name
        self.enable_version_counter = enable_version_counter
        self._save_on_train_epoch_end = save_on_train_epoch_end
        self._fields = parse_template(filename)
        # state
        self.best_k_models: dict[str, float] = {}
        self.kth_best_model_path = ""
        self.kth_value: float | None = None
        self.best_model_path = ""
        self._best_score: float | None = None
        self.current_score: torch.Tensor | None = None
        self.last_model_path = ""
        self._carried: tuple[str, float] | None = None  # best of a resumed run that saved elsewhere
        self._last_global_step_saved = 0  # nothing to save before the first step
        self._deferred = False  # a step save waits for the next validation (checkpoint_schedule.py)
        self._last_checkpoint_saved = ""  # the newest file this callback wrote in this run (save_last="link")
        self._experiment_roots: list[str] = []
        self._token = checkpoint_state.new_token()  # this run's; adopted from the state it resumes
        self._written: set[str] = set()  # the files this process wrote (deletable without reading them)

    @property
    def monitor(self) -> str | None:
        """The monitored key, or None (keep the latest checkpoints)."""
        return self._monitor.key

    @property
    def mode(self) -> str:
        """Which direction is better for the monitored key: "min" or "max"."""
        return self._monitor.mode

    @property
    def every_n_epochs(self) -> int:
        """Save into the top k every this many epochs (0: not by epochs)."""
        return self._schedule.every_n_epochs

    @property
    def every_n_train_steps(self) -> int:
        """Save every this many optimizer steps (0: not by steps)."""
        return self._schedule.every_n_train_steps

    @property
    def train_time_interval(self) -> timedelta | None:
        """Save whenever this much time has passed since the last such save (None: not by time)."""
        return self._schedule.train_time_interval

    @property
    def best_model_score(self) -> torch.Tensor | None:
        """The best monitored value so far (a tensor, as in Lightning), or None."""
        return None if self._best_score is None else torch.tensor(self._best_score)

    @best_model_score.setter
    def best_model_score(self, value: Any) -> None:  # an attribute in Lightning: assignable
        self._best_score = None if value is None else float(value)

    @property
    def state_key(self) -> str:
        keys = {
            "monitor": self.monitor,
            "mode": self.mode,
            "every_n_train_steps": self.every_n_train_steps,
            "every_n_epochs": self.every_n_epochs,
            "train_time_interval": self.train_time_interval,
        }
        return f"{type(self).__qualname__}{keys}"  # a subclass saves under its own name (Lightning)

    # ----- set-up -------------------------------------------------------------------------------
    def setup(self, trainer: Trainer, task: Task, stage: str) -> None:
        """Resolve the default directory (the same on every rank: rank 0's)."""
        if stage != "fit":
            return
        refuse_url(self.dirpath, "ModelCheckpoint's dirpath")
        if self.save_on_exception and trainer.world_size > 1:
            raise ConfigError(
                "ModelCheckpoint(save_on_exception=True) under several processes: a checkpoint needs every process, "
                "but an exception stops only the one it happens in; use save_last=True or stop with SIGTERM."
            )
        if self.dirpath is None:
            found = _logger_dir(trainer.loggers[0], trainer.default_root_dir) if trainer.loggers else None
            base = found if found is not None else trainer.default_root_dir  # <save_dir>/<name>/<version>
            self.dirpath = os.path.abspath(rank_zero_decides(trainer, os.path.join(base, "checkpoints")))
        # earlier starts of this experiment wrote into its other version_N directories
        roots = [lg.root_dir for lg in trainer.loggers if getattr(lg, "root_dir", "")]
        self._experiment_roots = roots if self._default_dirpath else []

    def on_train_start(self, trainer: Trainer, task: Task) -> None:
        self._schedule.restart()
        self._deferred = False  # a step save waits for the next validation (checkpoint_schedule.py)
        self._monitor.start()
        self._last_global_step_saved = max(self._last_global_step_saved, trainer.global_step)

    def _on_epoch_end(self, trainer: Trainer) -> bool:
        return at_train_epoch_end(trainer, self._save_on_train_epoch_end)

    def _skip(self, trainer: Trainer) -> bool:
        return (
            bool(trainer.config.fast_dev_run)
            or not fitting(trainer)
            or self._last_global_step_saved == trainer.global_step
        )

    # ----- triggers -----------------------------------------------------------------------------
    def on_train_batch_end(
        self, trainer: Trainer, task: Task, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._schedule.per_step and not self._skip(trainer) and self._schedule.step_due(trainer):
            if waits_for_validation(self, trainer, task.automatic_optimization, batch_idx):
                self._deferred = True  # saved at the validation's end, with its fresh metric (Lightning)
            else:
                self._save(trainer, topk=True, last_always=True)

    def on_validation_end(self, trainer: Trainer, task: Task) -> None:
        self._monitor.validation_ended(trainer)
        if not self._skip(trainer) and not self._on_epoch_end(trainer):
            deferred, self._deferred = self._deferred, False
            self._save(trainer, topk=deferred or self._schedule.epoch_due(trainer), last_always=deferred)

    def on_train_epoch_end(self, trainer: Trainer, task: Task) -> None:
        if not self._skip(trainer) and self._on_epoch_end(trainer):
            self._save(trainer, topk=self._schedule.epoch_due(trainer), last_always=False)

    def on_train_end(self, trainer: Trainer, task: Task) -> None:
        """save_last and nothing saved in this fit (save_top_k=0, or no save point reached): last.ckpt now."""
        if self.save_last and not self._last_checkpoint_saved and not trainer.config.fast_dev_run:
            self._save_last(trainer, self._candidates(trainer))

    def on_exception(self, trainer: Trainer, task: Task, exception: BaseException) -> None:
        """save_on_exception: a checkpoint (and last.ckpt) of the moment training failed."""
        if (
            self.save_on_exception
            and not trainer.config.fast_dev_run
            and not trainer.sanity_checking
            and self._last_global_step_saved != trainer.global_step
        ):
            candidates = self._candidates(trainer)
            values = {
                n: float(candidates.get(n, 0)) for n, _ in self._fields
            }  # not logged yet: 0, as Lightning
            self._write(trainer, self._unique_path(self.format_checkpoint_name(values, trainer), ""))
            self._save_last(trainer, candidates)

    # ----- saving -------------------------------------------------------------------------------
    def _candidates(self, trainer: Trainer) -> dict[str, Any]:
        return {"epoch": trainer.current_epoch, "step": trainer.global_step, **trainer.callback_metrics}

    def _save(self, trainer: Trainer, topk: bool, last_always: bool) -> None:
        """A save point: the top k, then last.ckpt (at an epoch's save point only if a file was just written,
        or to re-link it)."""
        candidates = self._candidates(trainer)
        if topk and self.save_top_k != 0:
            self._save_topk(trainer, candidates)
        saved_now = self._last_global_step_saved == trainer.global_step
        if last_always or saved_now or (self.save_last == "link" and self._last_checkpoint_saved):
            self._save_last(trainer, candidates)

    def _values(
        self, trainer: Trainer, candidates: dict[str, Any], names: list[str]
    ) -> dict[str, float] | None:
        """The floats of `names` (rank 0's on every rank), or None when they are not available yet."""
        return template_values(self, trainer, candidates, names)

    def _save_topk(self, trainer: Trainer, candidates: dict[str, Any]) -> None:
        names = [n for n, _ in self._fields] + ([self.monitor] if self.monitor else [])
        values = self._values(trainer, candidates, list(dict.fromkeys(names)))
        if values is None:
            return
        if self.monitor is None:
            self._save_latest(trainer, values)
            return
        current = self._monitor.score(values[self.monitor])  # NaN: never better than anything
        if self.monitor in ("epoch", "step"):  # counters stay integers (scores, tensors), as Lightning's
            current = int(current)
        if (
            self.save_top_k == -1
            or len(self.best_k_models) < self.save_top_k
            or self._monitor.better(current, self.kth_value)
        ):
            self._update_best_and_save(trainer, current, values)
        elif self.verbose:
            trainer.print(
                f"Epoch {trainer.current_epoch}, step {trainer.global_step}: {self.monitor!r} = "
                f"{current:.5g} was not in the top {self.save_top_k}"
            )

    def _update_best_and_save(self, trainer: Trainer, current: float, values: dict[str, float]) -> None:
        k = len(self.best_k_models) + 1 if self.save_top_k == -1 else self.save_top_k
        drop = ""
        if len(self.best_k_models) == k and k > 0:
            drop = self.kth_best_model_path
            self.best_k_models.pop(drop)
        path = self._unique_path(self.format_checkpoint_name(values, trainer), drop)
        self.current_score = torch.tensor(
            current
        )  # a tensor, as Lightning's (== 0.3 for a logged float32 0.3)
        self.best_k_models[path] = current
        if len(self.best_k_models) == k:
            self.kth_best_model_path = self._monitor.worst_of(self.best_k_models)
            self.kth_value = self.best_k_models[self.kth_best_model_path]
        pool = dict(self.best_k_models)
        if self._carried is not None:
            pool.setdefault(*self._carried)
        self.best_model_path = self._monitor.best_of(pool)
        self._best_score = pool[self.best_model_path]
        if self.verbose:
            trainer.print(
                f"Epoch {trainer.current_epoch}, step {trainer.global_step}: {self.monitor!r} reached "
                f"{current:.5g} (best {self._best_score:.5g}), saving {path!r} as top {k}"
            )
        self._write(trainer, path)
        if drop and drop != path:
            remove_file(self, trainer, drop)

    def _save_latest(self, trainer: Trainer, values: dict[str, float]) -> None:
        """monitor=None: keep the newest checkpoint (save_top_k=1) or every one (-1)."""
        previous = self.best_model_path if self.save_top_k == 1 else ""
        path = self._unique_path(self.format_checkpoint_name(values, trainer), previous)
        self.best_model_path = path
        self._write(trainer, path)
        if previous and previous != path:
            remove_file(self, trainer, previous)

    def _save_last(self, trainer: Trainer, candidates: dict[str, Any]) -> None:
        if not self.save_last:
            return
        path = os.path.join(self.dirpath or "", self.CHECKPOINT_NAME_LAST + self.FILE_EXTENSION)
        ours = self.last_model_path or (path if checkpoint_state.owned(self, path) else "")  # a stop's
        path = self._unique_path(path, ours)
        previous, self.last_model_path = self.last_model_path, path
        if self.save_last == "link" and self._last_checkpoint_saved and self.save_top_k != 0:
            link_last(trainer, self._last_checkpoint_saved, path)
        else:
            self._write(trainer, path)
        if previous and previous != path:
            remove_file(self, trainer, previous)

    def _write(self, trainer: Trainer, path: str) -> None:
        self._last_global_step_saved = trainer.global_step
        self._last_checkpoint_saved = path
        self._written.add(path)
        trainer.save_checkpoint(path, self.save_weights_only)  # atomic; rank 0 writes, all wait
        for logger in trainer.loggers if trainer.is_global_zero else []:  # trackers upload it (log_model)
            getattr(logger, "after_save_checkpoint", lambda cb: None)(
                self
            )  # (a duck-typed logger may lack it)

    def _unique_path(self, path: str, replaceable: str) -> str:
        """Append -v1, -v2, ... rather than overwrite a file this callback does not own."""
        return unique_path(path, replaceable) if self.enable_version_counter else path

    def format_checkpoint_name(self, values: dict[str, float], trainer: Trainer | None = None) -> str:
        """The file path for `values` (floats of the template's keys, plus epoch and step)."""
        if trainer is not None:
            values = {"epoch": trainer.current_epoch, "step": trainer.global_step, **values}
        equals = self.CHECKPOINT_EQUALS_CHAR if self.auto_insert_metric_name else None
        name = format_name(self.filename or "{epoch}-{step}", values, equals)
        return os.path.join(self.dirpath or "", name + self.FILE_EXTENSION)

    def last_checkpoint_path(self) -> str | None:
        """The newest last*.ckpt in this callback's directory, else in this experiment's other versions.

        With the default dirpath (``<save_dir>/<name>/version_N/checkpoints``, N new at every start) the
        experiment's place is ``<save_dir>/<name>``: only its ``version_*/checkpoints`` directories are
        searched, one level each, never other experiments or other files under default_root_dir.
        """
        paths = self.last_checkpoint_paths()
        return paths[0] if paths else None

    def last_checkpoint_paths(self) -> list[str]:
        """Every last*.ckpt that last_checkpoint_path considers, in its order of preference (newest first)."""
        if self.dirpath is None:
            return []
        own = newest_lasts([self.dirpath])
        return own or newest_lasts(
            [d for root in self._experiment_roots for d in version_checkpoint_dirs(root)]
        )

    # ----- checkpoint state (callbacks/checkpoint_state.py) --------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return checkpoint_state.state_dict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the top k when resuming into the same directory, keeping only this run's own files;
        otherwise remember the best only."""
        checkpoint_state.load_state_dict(self, state)


# The signature's annotations as objects rather than strings (this module's `from __future__ import
# annotations`), as Lightning's are: argument parsers built from it (jsonargparse, the CLI) read them.
ModelCheckpoint.__init__.__annotations__.update(get_type_hints(ModelCheckpoint.__init__))


def _logger_dir(logger: Any, root: str) -> str | None:
    """The first logger's directory: its `log_dir`; for a logger that has no such path (one of another library,
    a mock), Lightning's ``<save_dir or root>/<name>/<version>`` (`version_N` for a number)."""
    found = getattr(logger, "log_dir", None)
    if found is None or isinstance(found, (str, os.PathLike)):
        return found
    save_dir, version = getattr(logger, "save_dir", None), getattr(logger, "version", None)
    save_dir = save_dir if isinstance(save_dir, (str, os.PathLike)) else root
    version = version if isinstance(version, str) else f"version_{version}"
    return os.path.join(save_dir, str(getattr(logger, "name", "")), version)
