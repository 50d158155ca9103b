"""ModelCheckpoint: save checkpoints by epoch, step or time; keep the top k by a monitored metric."""

from __future__ import annotations

import math
import os
import re
import shutil
import time
import warnings
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch

from callbacks.base import Callback
from callbacks.early_stopping import missing_key_message
from trainer.errors import ConfigError, choose

if TYPE_CHECKING:
    from trainer.task import Task
    from trainer.trainer import Trainer

_FIELD = re.compile(r"\{([^{}:]+)(?::([^{}]*))?\}")
_LAST = re.compile(r"last(-v\d+)?\.ckpt")


class ModelCheckpoint(Callback):
    """Saves checkpoints (atomically, through ``trainer.save_checkpoint``) into `dirpath`.

    With `monitor`, keeps the `save_top_k` best by that metric (`mode` "min" or "max") and deletes the files
    that fall out; without it, keeps the latest (save_top_k=1) or all (-1). `filename` is a template over
    ``epoch``, ``step`` and logged keys: ``"{epoch}-{val/loss:.3f}"`` gives ``epoch=3-val_loss=0.123.ckpt``
    ('/' in a key becomes '_'). `save_last` also keeps ``last.ckpt`` for ``fit(ckpt_path="last")``.
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
        save_last: bool | None = None,
        save_top_k: int = 1,
        save_weights_only: bool = False,
        mode: str = "min",
        auto_insert_metric_name: bool = True,
        every_n_train_steps: int | None = None,
        train_time_interval: timedelta | float | None = None,
        every_n_epochs: int | None = None,
        save_on_train_epoch_end: bool | None = None,
        enable_version_counter: bool = True,
    ) -> None:
        choose("ModelCheckpoint mode", mode, ("min", "max"))
        if not isinstance(save_top_k, int) or save_top_k < -1:
            raise ConfigError(f"ModelCheckpoint(save_top_k=...) must be an int >= -1, got {save_top_k!r}.")
        if monitor is None and save_top_k not in (-1, 0, 1):
            raise ConfigError(
                f"ModelCheckpoint(save_top_k={save_top_k}) needs monitor=...: without a metric "
                "there is no 'top'; use save_top_k=-1 to keep every checkpoint."
            )
        given = [
            n
            for n, v in (
                ("every_n_train_steps", every_n_train_steps),
                ("every_n_epochs", every_n_epochs),
                ("train_time_interval", train_time_interval),
            )
            if v
        ]
        if len(given) > 1:
            raise ConfigError(
                f"ModelCheckpoint: {' and '.join(given)} are mutually exclusive; pass one of them."
            )
        for name, v in (("every_n_train_steps", every_n_train_steps), ("every_n_epochs", every_n_epochs)):
            if v is not None and (not isinstance(v, int) or v < 0):
                raise ConfigError(f"ModelCheckpoint({name}=...) must be an int >= 0, got {v!r}.")
        self.dirpath = os.path.abspath(os.fspath(dirpath)) if dirpath is not None else None
        self._default_dirpath = dirpath is None
        self.filename = filename
        self.monitor = monitor
        self.verbose = verbose
        self.save_last = save_last
        self.save_top_k = save_top_k
        self.save_weights_only = save_weights_only
        self.mode = mode
        self.auto_insert_metric_name = auto_insert_metric_name
        self.enable_version_counter = enable_version_counter
        self._save_on_train_epoch_end = save_on_train_epoch_end
        if isinstance(train_time_interval, (int, float)):
            train_time_interval = timedelta(seconds=train_time_interval)
        self.train_time_interval = train_time_interval
        self._interval_s = train_time_interval.total_seconds() if train_time_interval else 0.0
        no_trigger = not every_n_train_steps and every_n_epochs is None and not train_time_interval
        self.every_n_epochs = 1 if no_trigger else (every_n_epochs or 0)
        self.every_n_train_steps = every_n_train_steps or 0
        self._fields = self._parse_template(filename)
        # state
        self.best_k_models: dict[str, float] = {}
        self.kth_best_model_path = ""
        self.kth_value: float | None = None
        self.best_model_path = ""
        self._best_score: float | None = None
        self.current_score: float | None = None
        self.last_model_path = ""
        self._carried: tuple[str, float] | None = None  # best of a resumed run that saved elsewhere
        self._last_global_step_saved = 0  # nothing to save before the first step
        self._last_time = time.monotonic()
        self._val_has_run = False
        self._search_roots: list[str] = []
        self._warned: set[str] = set()

    @property
    def best_model_score(self) -> torch.Tensor | None:
        """The best monitored value so far (a tensor, as in Lightning), or None."""
        return None if self._best_score is None else torch.tensor(self._best_score)

    @property
    def state_key(self) -> str:
        keys = {
            "monitor": self.monitor,
            "mode": self.mode,
            "every_n_train_steps": self.every_n_train_steps,
            "every_n_epochs": self.every_n_epochs,
            "train_time_interval": self.train_time_interval,
        }
        return f"ModelCheckpoint{keys}"

    # ----- set-up -------------------------------------------------------------------------------
    def _parse_template(self, filename: str | None) -> list[tuple[str, str]]:
        fields = [(m.group(1).strip(), m.group(2) or "") for m in _FIELD.finditer(filename or "")]
        for name, spec in fields:
            try:
                format(0.0, spec)
            except ValueError as e:
                raise ConfigError(
                    f"ModelCheckpoint(filename={filename!r}): bad format {spec!r} for {name!r}: {e}"
                ) from e
        return fields

    def setup(self, trainer: Trainer, task: Task, stage: str) -> None:
        """Resolve the default directory (the same on every rank: rank 0's)."""
        if stage != "fit":
            return
        if self.dirpath is None:
            base = trainer.log_dir if trainer.loggers else trainer.default_root_dir
            self.dirpath = os.path.abspath(trainer.strategy.comm.broadcast(os.path.join(base, "checkpoints")))
        roots = [self.dirpath]
        if self._default_dirpath:  # earlier runs of this experiment wrote into sibling version directories
            roots += [
                os.path.join(lg.root_dir, "*", "checkpoints")
                for lg in trainer.loggers
                if hasattr(lg, "root_dir")
            ]
            roots.append(os.path.join(trainer.default_root_dir, "checkpoints"))
        self._search_roots = roots

    def on_train_start(self, trainer: Trainer, task: Task) -> None:
        self._last_time = time.monotonic()
        self._val_has_run = False
        self._last_global_step_saved = max(self._last_global_step_saved, trainer.global_step)

    def _on_epoch_end(self, trainer: Trainer) -> bool:
        if self._save_on_train_epoch_end is not None:
            return self._save_on_train_epoch_end
        cfg = trainer.config
        if cfg.check_val_every_n_epoch != 1:
            return False
        no_val = not trainer.val_dataloaders or sum(trainer.num_val_batches) == 0
        return no_val or cfg.val_check_interval == 1.0

    def _skip(self, trainer: Trainer) -> bool:
        return (
            bool(trainer.config.fast_dev_run)
            or trainer.sanity_checking
            or trainer.stage != "fit"
            or self._last_global_step_saved == trainer.global_step
        )

    # ----- triggers -----------------------------------------------------------------------------
    def on_train_batch_end(
        self, trainer: Trainer, task: Task, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not (self.every_n_train_steps or self._interval_s) or self._skip(trainer):
            return
        due = bool(self.every_n_train_steps) and trainer.global_step % self.every_n_train_steps == 0
        if self._interval_s:
            now = time.monotonic()
            late = now - self._last_time >= self._interval_s
            if trainer.world_size > 1:  # clocks differ: rank 0 decides, or the ranks would not save together
                late = bool(trainer.strategy.comm.broadcast(late))
            if late:
                self._last_time = now
            due = due or late
        if due:
            self._save(trainer, epoch_trigger=True)

    def on_validation_end(self, trainer: Trainer, task: Task) -> None:
        if trainer.stage == "fit" and not trainer.sanity_checking:
            self._val_has_run = True
        if not self._skip(trainer) and not self._on_epoch_end(trainer):
            self._save(trainer, epoch_trigger=self._epoch_due(trainer))

    def on_train_epoch_end(self, trainer: Trainer, task: Task) -> None:
        if not self._skip(trainer) and self._on_epoch_end(trainer):
            self._save(trainer, epoch_trigger=self._epoch_due(trainer))

    def on_train_end(self, trainer: Trainer, task: Task) -> None:
        """Bring last.ckpt up to date when training stopped between two saves (max_steps, a stop request)."""
        if (
            self.save_last
            and trainer.global_step != self._last_global_step_saved
            and not trainer.config.fast_dev_run
        ):
            self._save_last(trainer, self._candidates(trainer))

    def _epoch_due(self, trainer: Trainer) -> bool:
        return self.every_n_epochs >= 1 and (trainer.current_epoch + 1) % self.every_n_epochs == 0

    # ----- saving -------------------------------------------------------------------------------
    def _candidates(self, trainer: Trainer) -> dict[str, Any]:
        return {"epoch": trainer.current_epoch, "step": trainer.global_step, **trainer.callback_metrics}

    def _save(self, trainer: Trainer, epoch_trigger: bool) -> None:
        candidates = self._candidates(trainer)
        if epoch_trigger and self.save_top_k != 0:
            self._save_topk(trainer, candidates)
        self._save_last(trainer, candidates)

    def _values(
        self, trainer: Trainer, candidates: dict[str, Any], names: list[str]
    ) -> dict[str, float] | None:
        """The floats of `names` (rank 0's on every rank), or None when they are not available yet."""
        missing = [n for n in names if n not in candidates]
        if missing:
            if self.monitor in missing:
                message = missing_key_message(
                    f"ModelCheckpoint(monitor={self.monitor!r})", self.monitor, trainer
                )
            else:
                message = (
                    f"ModelCheckpoint(filename={self.filename!r}) uses {missing}, which were never logged; "
                    f"logged keys: {sorted(trainer.callback_metrics)}. Log them with self.log or change "
                    "the template."
                )
            no_val = not trainer.val_dataloaders or sum(trainer.num_val_batches) == 0
            if self._val_has_run or no_val:
                raise ConfigError(message)
            if (
                message not in self._warned and trainer.is_global_zero
            ):  # perhaps a validation metric: wait for it
                warnings.warn(message + " Skipping this save until validation has run.", stacklevel=2)
            self._warned.add(message)
            return None
        values = {n: float(candidates[n]) for n in names}
        return trainer.strategy.comm.broadcast(values) if trainer.world_size > 1 else values

    def _save_topk(self, trainer: Trainer, candidates: dict[str, Any]) -> None:
        names = [n for n, _ in self._fields] + ([self.monitor] if self.monitor else [])
        values = self._values(trainer, candidates, list(dict.fromkeys(names)))
        if values is None:
            return
        if self.monitor is None:
            self._save_latest(trainer, values)
            return
        current = values[self.monitor]
        if math.isnan(current):  # never better than anything
            current = math.inf if self.mode == "min" else -math.inf
        if (
            self.save_top_k == -1
            or len(self.best_k_models) < self.save_top_k
            or self._better(current, self.kth_value)
        ):
            self._update_best_and_save(trainer, current, values)
        elif self.verbose:
            trainer.print(
                f"Epoch {trainer.current_epoch}, step {trainer.global_step}: {self.monitor!r} = "
                f"{current:.5g} was not in the top {self.save_top_k}"
            )

    def _better(self, a: float, b: float | None) -> bool:
        if b is None:
            return True
        return a < b if self.mode == "min" else a > b

    def _update_best_and_save(self, trainer: Trainer, current: float, values: dict[str, float]) -> None:
        k = len(self.best_k_models) + 1 if self.save_top_k == -1 else self.save_top_k
        drop = ""
        if len(self.best_k_models) == k and k > 0:
            drop = self.kth_best_model_path
            self.best_k_models.pop(drop)
        path = self._unique_path(self.format_checkpoint_name(values, trainer), drop)
        self.current_score = current
        self.best_k_models[path] = current
        worst, best = (max, min) if self.mode == "min" else (min, max)
        if len(self.best_k_models) == k:
            self.kth_best_model_path = worst(self.best_k_models, key=self.best_k_models.__getitem__)
            self.kth_value = self.best_k_models[self.kth_best_model_path]
        pool = dict(self.best_k_models)
        if self._carried is not None:
            pool.setdefault(*self._carried)
        self.best_model_path = best(pool, key=pool.__getitem__)
        self._best_score = pool[self.best_model_path]
        if self.verbose:
            trainer.print(
                f"Epoch {trainer.current_epoch}, step {trainer.global_step}: {self.monitor!r} reached "
                f"{current:.5g} (best {self._best_score:.5g}), saving {path!r} as top {k}"
            )
        self._write(trainer, path)
        if drop and drop != path:
            self._remove(trainer, drop)

    def _save_latest(self, trainer: Trainer, values: dict[str, float]) -> None:
        """monitor=None: keep the newest checkpoint (save_top_k=1) or every one (-1)."""
        previous = self.best_model_path if self.save_top_k == 1 else ""
        path = self._unique_path(self.format_checkpoint_name(values, trainer), previous)
        self.best_model_path = path
        self._write(trainer, path)
        if previous and previous != path:
            self._remove(trainer, previous)

    def _save_last(self, trainer: Trainer, candidates: dict[str, Any]) -> None:
        if not self.save_last:
            return
        path = os.path.join(self.dirpath or "", self.CHECKPOINT_NAME_LAST + self.FILE_EXTENSION)
        path = self._unique_path(path, self.last_model_path)
        previous, self.last_model_path = self.last_model_path, path
        self._write(trainer, path)
        if previous and previous != path:
            self._remove(trainer, previous)

    def _write(self, trainer: Trainer, path: str) -> None:
        self._last_global_step_saved = trainer.global_step
        trainer.save_checkpoint(path, weights_only=self.save_weights_only)  # atomic; rank 0 writes, all wait

    def _remove(self, trainer: Trainer, path: str) -> None:
        """Delete a checkpoint that fell out of the top k (rank 0; never the last checkpoint or another run's)."""
        keep = {self.last_model_path, self.best_model_path, *self.best_k_models}
        inside = os.path.dirname(os.path.abspath(path)) == self.dirpath
        if trainer.is_global_zero and path not in keep and inside and os.path.exists(path):
            shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)  # a directory: sharded (FSDP)

    def _unique_path(self, path: str, replaceable: str) -> str:
        """Append -v1, -v2, ... rather than overwrite a file this callback does not own."""
        if not self.enable_version_counter:
            return path
        stem, ext = os.path.splitext(path)
        candidate, n = path, 1
        while os.path.exists(candidate) and candidate != replaceable:
            candidate, n = f"{stem}-v{n}{ext}", n + 1
        return candidate

    def format_checkpoint_name(self, values: dict[str, float], trainer: Trainer | None = None) -> str:
        """The file path for `values` (floats of the template's keys, plus epoch and step)."""
        if trainer is not None:
            values = {"epoch": trainer.current_epoch, "step": trainer.global_step, **values}
        template = self.filename or "{epoch}-{step}"

        def fill(m: re.Match[str]) -> str:
            name, spec = m.group(1).strip(), m.group(2) or ""
            value = values[name]
            if name in ("epoch", "step"):
                value = int(value)
            text = format(value, spec)
            return (
                f"{name.replace('/', '_')}{self.CHECKPOINT_EQUALS_CHAR}{text}"
                if self.auto_insert_metric_name
                else text
            )

        name = _FIELD.sub(fill, template).replace("/", "_")
        return os.path.join(self.dirpath or "", name + self.FILE_EXTENSION)

    def last_checkpoint_path(self) -> str | None:
        """The newest last*.ckpt in this callback's directory (or this experiment's earlier versions)."""
        import glob

        for root in self._search_roots:
            found = [
                p for p in glob.glob(os.path.join(root, "last*.ckpt")) if _LAST.fullmatch(os.path.basename(p))
            ]
            if found:
                return max(found, key=os.path.getmtime)
        return None

    # ----- checkpoint state ---------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "monitor": self.monitor,
            "mode": self.mode,
            "dirpath": self.dirpath,
            "best_model_score": self._best_score,
            "best_model_path": self.best_model_path,
            "current_score": self.current_score,
            "best_k_models": dict(self.best_k_models),
            "kth_best_model_path": self.kth_best_model_path,
            "kth_value": self.kth_value,
            "last_model_path": self.last_model_path,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the top k when resuming into the same directory; otherwise remember the best only."""
        score = state.get("best_model_score")
        self._best_score = None if score is None else float(score)
        self.best_model_path = state.get("best_model_path", "")
        if state.get("dirpath") == self.dirpath:
            self.best_k_models = {k: float(v) for k, v in state.get("best_k_models", {}).items()}
            self.kth_best_model_path = state.get("kth_best_model_path", "")
            self.kth_value = state.get("kth_value")
            self.current_score = state.get("current_score")
            self.last_model_path = state.get("last_model_path", "")
        elif self.best_model_path and self._best_score is not None:
            self._carried = (self.best_model_path, self._best_score)
