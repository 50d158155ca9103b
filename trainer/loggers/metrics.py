"""self.log: step values and batch-size-weighted epoch aggregates, kept on device until written."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from strategies.batch import batch_size_of, is_metric
from tandem_core.errors import TaskError, check_choice
from tandem_core.rank_zero import rank_zero_warn
from trainer.loggers.floats import to_floats
from trainer.loggers.log_rules import RULES, Rule, epoch_only, no_logger, refusal

REDUCE_FX = ("mean", "sum", "max", "min")
_Tensor = torch.Tensor


class LogValueError(TaskError, ValueError):
    """self.log got a value that is not a number, a one-element tensor or a Metric (a ValueError, as Lightning's)."""


@dataclass
class _Entry:
    name: str  # the key: the logged name and, with several evaluation loaders, the loader's suffix
    on_step: bool
    on_epoch: bool
    prog_bar: bool
    logger: bool
    sync_dist: bool
    reduce_fx: str
    group: Any = None  # sync_dist_group: the ranks sync_dist reduces over (None: all)
    metric: Any = None
    total: torch.Tensor | None = None
    weight: int = 0
    step_value: torch.Tensor | None = None
    step_batch: int = field(default=-1)  # the batch (MetricStore._batch_no) in which step_value was logged
    suffix: str = ""  # "/dataloader_idx_N" with several evaluation loaders (at the end of the key)
    loader: str = ""  # the suffix of the loader it was logged in, even with add_dataloader_idx=False
    fx: str | None = None  # the step or hook that first logged it
    # the arguments of the last self.log that reached it (MetricStore.log's fast path)
    call: tuple[Any, ...] = ()
    step_key: str = ""  # the key of its step value: the name, or with on_epoch too, the "_step" fork
    # whether its step value is not the logged tensor: reduced (sync_dist) or copied (CUDA graphs)
    special: bool = False
    train: bool = False  # logged in training (whose step values callbacks and trainer.logged_metrics see)

    def __post_init__(self) -> None:
        self.step_key = self.forked("_step") if self.on_epoch else self.name

    def forked(self, fork: str) -> str:
        """The key of the step ("_step") or epoch ("_epoch") value: Lightning puts the fork before the suffix."""
        return self.name[: len(self.name) - len(self.suffix)] + fork + self.suffix


class MetricStore:
    """Collects what a Task logs during one stage and turns it into step and epoch metrics.

    Example: ``store.log("train/loss", loss)`` during a step, then ``store.epoch_end()`` at epoch end.
    """

    def __init__(self, reduce: Callable[[torch.Tensor, str], torch.Tensor]) -> None:
        self._reduce = reduce  # the strategy's cross-rank reduce, for sync_dist
        self._stages: dict[str, dict[str, _Entry]] = {"train": {}}
        self._entries = self._stages["train"]  # the current stage's (self.stage), looked up once per change
        self.callback_metrics: dict[str, torch.Tensor] = {}
        # the epoch values shown in the bar so far: as Lightning's, the bar keeps an earlier epoch's values
        # (on_train_epoch_end's epoch_metric_0 still shows in epoch 2) while they are callback metrics
        self._bar_kept: dict[str, None] = {}
        self.stage = "train"
        self._fx: str | None = None  # the step or hook running now (trainer/loggers/log_rules.py)
        self._rule: Rule | None = None
        self._opened: str | None = None  # the stage whose run open_run started and no epoch has yet
        self.dataloader_suffix = ""
        self.iter_training = False  # training_step reads its own batches (dataloader_iter): no batch to size
        self._batch: Any = None
        self._batch_size = 1
        self._sized = -1  # the batch (_batch_no) whose size _batch_size is
        # counts set_batch calls; step values are written only in the batch that logged them
        self._batch_no = 0
        # inside the training batches (else None): the step values logged for loggers since trainer.logged_metrics
        # last took them (trainer/loggers/logged.py reads them back when asked, not at every step)
        self.pending: dict[str, torch.Tensor] | None = None
        self.keep_copies = False  # CUDA graphs: keep copies of step values, which the next replay overwrites
        self.barebones = False  # Trainer(barebones=True): self.log is refused
        self.no_logger = False  # the stage runs without a logger (set when it starts: loggers/reporting.py)

    @property
    def entries(self) -> dict[str, _Entry]:
        return self._stages[self.stage]

    @property
    def fx(self) -> str | None:
        """The step or hook running now, which decides where self.log records (None: none of the Trainer's)."""
        return self._fx

    @fx.setter
    def fx(self, name: str | None) -> None:
        self._fx, self._rule = name, RULES.get(name) if name is not None else None

    def reset(self, stage: str) -> None:
        """Start a new epoch of `stage`, dropping that stage's previous aggregates (others are kept)."""
        self.stage = stage
        self._stages[stage] = self._entries = {}
        self._opened = None

    def drop_all(self) -> None:
        """A new stage starts: every value logged before is dropped (as Lightning resets its metrics then)."""
        for entries in self._stages.values():
            entries.clear()
        self.callback_metrics.clear()
        self._bar_kept.clear()

    def open_run(self, stage: str) -> None:
        """A run of `stage` starts (fit's on_train_start follows): what it logs joins the first epoch."""
        self.reset(stage)
        self._opened = stage

    def start_epoch(self, stage: str) -> None:
        """An epoch of `stage` starts: drop the previous epoch's values, not what its run's start logged."""
        if self._opened == stage:
            self.stage, self._opened = stage, None
            self._entries = self._stages[stage]
        else:
            self.reset(stage)

    def forget(self, stage: str) -> None:
        """Drop what `stage` logged (after the sanity check, as Lightning resets its metrics then)."""
        if stage != self.stage:
            self._stages.pop(stage, None)

    def switch(self, stage: str) -> None:
        """Continue logging into `stage` (back to training after a mid-epoch validation)."""
        self.stage = stage
        self._entries = self._stages.setdefault(stage, {})

    def set_batch(self, batch: Any) -> None:
        """Remember the current batch; its size is inferred only if an epoch aggregate needs it."""
        self._batch = batch
        self._batch_no += 1

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
        rank_zero_only: bool = False,
    ) -> None:
        """Record `value` (tensor, number or torchmetrics Metric) under `name`, with Lightning's options:
        `enable_graph` keeps the graph of a logged Metric's batch value (a tensor's is detached either way,
        as Lightning's: it stores them without grad);
        `sync_dist` reduces the step value at once and the epoch aggregate at epoch end by `reduce_fx` over
        the ranks (of `sync_dist_group` when given), except with `rank_zero_only` (a value logged on rank 0
        alone must not wait for the others); `add_dataloader_idx=False` keeps the name as it is when several
        evaluation loaders run. (Lightning's `metric_attribute` names where a logged Metric lives so that it
        can restore its state; the store holds the Metric itself and needs no name.)"""
        call = (self._fx, self.dataloader_suffix, prog_bar, logger, on_step, on_epoch, reduce_fx, sync_dist,
                sync_dist_group, add_dataloader_idx, rank_zero_only)  # fmt: skip
        entry = self._entries.get(name)
        if entry is None or entry.call != call:  # (else: the same call as the last one, checked then)
            entry = self._entry(name, call)
        if type(value) is _Tensor and value.ndim == 0:  # the common case: a loss
            value = value.detach()
        elif is_metric(value):
            entry.metric = value
            cached = getattr(value, "_forward_cache", None)
            if not isinstance(cached, torch.Tensor):
                return
            value = cached if enable_graph else cached.detach()
        else:
            value = self._as_tensor(name, value)
        if entry.on_step:
            # as Lightning: with sync_dist every rank's step value is the reduced one (the epoch aggregate
            # adds the local values and is reduced once, at epoch end)
            step_value = self._step_value(entry, value) if entry.special else value
            entry.step_value = step_value
            entry.step_batch = self._batch_no
            if entry.train:  # as Lightning: callbacks see training's step values, under the name
                self.callback_metrics[entry.name] = step_value  # too until the epoch's value replaces it;
                if entry.on_epoch:  # never an evaluation's (they reach the loggers only)
                    self.callback_metrics[entry.step_key] = step_value
                pending = self.pending
                if pending is not None and entry.logger:
                    pending[entry.step_key] = step_value
        if entry.on_epoch and entry.metric is None:
            self._accumulate(entry, value, batch_size)

    def _step_value(self, entry: _Entry, value: torch.Tensor) -> torch.Tensor:
        """A step value other than the logged tensor: reduced (sync_dist), or a copy (CUDA graphs' replays)."""
        if entry.sync_dist:
            value = self._sync(value, entry.reduce_fx, entry.group)
        return value.clone() if self.keep_copies else value

    def _entry(self, name: str, call: tuple[Any, ...]) -> _Entry:
        """The entry a self.log call with other arguments than the last one reaches (the first call of a name,
        a name logged from several hooks): its options checked, the entry found or made."""
        (
            fx,
            suffix,
            prog_bar,
            logger,
            on_step,
            on_epoch,
            reduce_fx,
            sync_dist,
            group,
            add_idx,
            rank_zero_only,
        ) = call
        if reduce_fx != "mean":
            if not isinstance(reduce_fx, str):
                reduce_fx = getattr(reduce_fx, "__name__", str(reduce_fx))
            reduce_fx = reduce_fx.lower()  # as Lightning: "SUM" and "avg" (for "mean") too
            reduce_fx = "mean" if reduce_fx == "avg" else reduce_fx
            check_choice("reduce_fx", reduce_fx, REDUCE_FX)
        if self.barebones:
            raise TaskError(
                f"self.log({name!r}, ...) with Trainer(barebones=True): barebones logs nothing; remove it."
            )
        if logger and self.no_logger:  # as Lightning (whose warning is per call; here per name and epoch)
            rank_zero_warn(no_logger(name))
        rule = self._rule
        if rule is None:
            raise TaskError(refusal(name, fx))
        if on_step is None:
            on_step = rule.on_step
        if on_epoch is None:
            on_epoch = rule.on_epoch
        if not on_step and not on_epoch:  # as Lightning: it would record nothing
            raise TaskError(
                f"self.log({name!r}, on_step=False, on_epoch=False) records nothing; set one of them."
            )
        if not rule.batch and (on_step or not on_epoch):
            raise TaskError(epoch_only(name, fx or "", on_step, on_epoch))
        key = name + suffix if suffix and add_idx else name
        entries = self._stages[self.stage]
        slot = key
        entry = entries.get(slot)
        if entry is not None and entry.fx != fx and (entry.on_step, entry.on_epoch) != (on_step, on_epoch):
            # as Lightning, which keeps a value per hook: the name logged again in another hook with other
            # on_step/on_epoch (training_step's step value, on_train_epoch_end's epoch value) is a value of
            # its own, and the one written later shows under the name
            slot = f"{fx}\x00{key}"
            entry = entries.get(slot)
        if entry is None:  # the first time this name is logged in this stage's epoch
            if add_idx and "/dataloader_idx_" in name:
                raise TaskError(
                    f"self.log({name!r}): the name holds '/dataloader_idx_', which the Trainer appends itself "
                    "with several evaluation loaders; drop it, or pass add_dataloader_idx=False."
                )
            sync = sync_dist and not rank_zero_only
            entry = entries[slot] = _Entry(
                key, on_step, on_epoch, prog_bar, logger is not False, sync, reduce_fx, group,
                suffix=suffix if add_idx else "", loader=suffix, fx=fx,
            )  # fmt: skip
        elif entry.fx == fx and (entry.on_step, entry.on_epoch, entry.prog_bar, entry.logger, entry.reduce_fx) != (
            on_step, on_epoch, prog_bar, logger is not False, reduce_fx
        ):  # fmt: skip
            raise TaskError(
                f"self.log({name!r}, ...) was called twice in {fx} with different arguments (on_step, "
                "on_epoch, prog_bar, logger or reduce_fx); log it once per step, or under another name."
            )
        entry.call = call
        entry.special = entry.sync_dist or self.keep_copies
        entry.train = self.stage == "train"
        return entry

    def _sync(self, value: torch.Tensor, op: str, group: Any) -> torch.Tensor:
        return self._reduce(value, op) if group is None else self._reduce(value, op, group)

    @staticmethod
    def _as_tensor(name: str, value: Any) -> torch.Tensor:
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise LogValueError(
                    f"self.log({name!r}) got a tensor of shape {tuple(value.shape)}; log a scalar."
                )
            value = value.detach()
            return value if value.ndim == 0 else value.reshape(())  # reshape costs ~4 us even when a no-op
        if isinstance(value, (int, float, bool)):
            return torch.tensor(float(value))
        raise LogValueError(
            f"self.log({name!r}) got {type(value).__name__}; log a number, a scalar tensor or a Metric."
        )

    def _accumulate(self, entry: _Entry, value: torch.Tensor, batch_size: int | None) -> None:
        if entry.reduce_fx == "mean":
            if batch_size is None:
                if self._sized != self._batch_no:  # (inferred once per batch, when first needed)
                    self._batch_size = batch_size_of(self._batch) if self._batch is not None else 1
                    self._sized = self._batch_no
                batch_size = self._batch_size
            weighted = value.float() * batch_size
            entry.total = weighted if entry.total is None else entry.total + weighted
            entry.weight += batch_size
        elif (
            entry.total is None
        ):  # (a copy: the logged tensor may change in place, or be a CUDA graph's output)
            entry.total = value.to(torch.float32, copy=True)
        elif entry.reduce_fx == "sum":
            entry.total = entry.total + value
        elif entry.reduce_fx == "max":
            entry.total = torch.maximum(entry.total, value)
        else:
            entry.total = torch.minimum(entry.total, value)

    def step_metrics(self) -> dict[str, torch.Tensor]:
        """The step values logged during the current batch and meant for loggers (still tensors)."""
        return {
            (e.forked("_step") if e.on_epoch else e.name): e.step_value
            for e in self.entries.values()
            if e.on_step and e.logger and e.step_value is not None and e.step_batch == self._batch_no
        }

    def epoch_end(self) -> dict[str, torch.Tensor]:
        """Finish the epoch: compute (and sync) each epoch aggregate; returns those meant for loggers."""
        to_log: dict[str, torch.Tensor] = {}
        for e in self.entries.values():
            if not e.on_epoch:
                if e.metric is not None:  # as Lightning: a logged Metric's state ends with the epoch
                    e.metric.reset()
                continue
            if e.metric is not None:
                value = e.metric.compute()  # torchmetrics synchronises across ranks itself
                if not isinstance(value, torch.Tensor):  # a value error, as Lightning's
                    raise LogValueError(
                        f"The `{type(e.metric).__name__}.compute()` return of the metric logged as {e.name!r} must "
                        f"be a tensor (one value); it returned {type(value).__name__}. Log each value separately."
                    )
                value = value.detach()
                e.metric.reset()
            elif e.total is None:
                continue
            elif e.reduce_fx == "mean":
                total = e.total
                weight = torch.tensor(float(e.weight), device=total.device)
                if e.sync_dist:
                    total, weight = self._sync(total, "sum", e.group), self._sync(weight, "sum", e.group)
                value = total / weight
            else:
                value = self._sync(e.total, e.reduce_fx, e.group) if e.sync_dist else e.total
            key = e.forked("_epoch") if e.on_step else e.name
            self.callback_metrics[key] = value
            self.callback_metrics[e.name] = value
            if e.prog_bar:
                self._bar_kept[key] = None
            if e.logger:
                to_log[key] = value
        return to_log

    def loader_of(self, key: str) -> int | None:
        """The evaluation loader whose batches logged `key` (an epoch value's key), None when logged outside them."""
        for e in self.entries.values():
            if key in (e.name, e.forked("_epoch")) and e.loader:
                return int(e.loader.rsplit("_", 1)[-1])
        return None

    def progress_bar_tensors(self) -> dict[str, torch.Tensor]:
        """Values marked prog_bar=True: the latest step values and epoch values of every stage (as Lightning's
        trainer.progress_bar_metrics, which keeps an evaluation's values once it has ended, and earlier epochs')."""
        kept = self.callback_metrics
        out: dict[str, torch.Tensor] = {k: kept[k] for k in self._bar_kept if k in kept}
        for entries in self._stages.values():
            for e in entries.values():
                if not e.prog_bar:
                    continue
                if e.on_step and e.step_value is not None:
                    out[e.forked("_step") if e.on_epoch else e.name] = e.step_value
                if e.on_epoch:
                    key = e.forked("_epoch") if e.on_step else e.name
                    if key in self.callback_metrics:
                        out[key] = self.callback_metrics[key]
        return out

    def progress_bar_metrics(self) -> dict[str, float]:
        """progress_bar_tensors() as floats (this synchronizes with the device: call it only when drawing)."""
        return to_floats(self.progress_bar_tensors())
