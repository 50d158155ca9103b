"""One training epoch's fixed parts, looked up before its first batch: the feed of batches (trainer/loop/feeds.py),
the step function of this configuration (automatic with one batch per window, automatic with accumulation,
manual; each with or without the profiler), and what follows a step (the validation schedule, the batch-end
hook, logging, the stop agreement). trainer/loop/fit.py's `train_epoch` runs them; a step pays only for what
this epoch's configuration asks for."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from strategies.base import batch_mover
from tandem_core.rank_zero import rank_zero_info
from trainer.checkpoint.run import check_window_saves
from trainer.compiler import mark_step
from trainer.loggers.logged import close_batches, open_batches
from trainer.loggers.reporting import log_metrics
from trainer.loop.closure import Closure, manual_outputs
from trainer.loop.data import set_epoch
from trainer.loop.evaluation import run_eval
from trainer.loop.feeds import epoch_iterator, feed, map_style
from trainer.loop.hooks import run_as
from trainer.loop.loader_iter import check_world_size, takes_loader_iter, training_feed
from trainer.loop.optim import step_schedulers
from trainer.loop.signals import settle_stop, stop_checker
from trainer.loop.stepper import batch_stepper, none_batch, stepper
from trainer.loop.transfer import to_device
from trainer.loop.val_schedule import (
    load_val,
    should_validate,
    time_due,
    val_check_batches,
    val_check_seconds,
)

if TYPE_CHECKING:
    from trainer.trainer import Trainer


class EpochRun:
    """The training epoch about to run on `t` (see the module docstring); `batches`, `step` and `after_step`
    are what the loop calls per batch, `end` runs the epoch's end."""

    def __init__(self, t: Trainer) -> None:
        cfg, state, hooks, task, store = t.config, t.state, t.hooks, t.task, t.metric_store
        assert task is not None
        self.t, self.state, self.store = t, state, store
        self.automatic = automatic = task.automatic_optimization
        # validation every val_every batches (0: only at the epoch's end); check_val_every_n_epoch gates it too
        self.val_every = val_every = val_check_batches(t) if should_validate(t) else 0
        self.timed = val_check_seconds(t)  # a wall-time val_check_interval: validate once it has passed
        set_epoch(t.loaders["train"][0], state.epoch)
        state.phase = "train"
        store.start_epoch("train")
        if state.batch_in_epoch == 0:  # as Lightning: a run resumed inside an epoch does not start it again
            hooks.call("on_train_epoch_start")
        cfg = t.config  # again after the hook: GradientAccumulationScheduler may have changed it
        self.k = cfg.accumulate_grad_batches
        self.log_every = 1 if cfg.fast_dev_run else cfg.log_every_n_steps  # (fast_dev_run logs every step)
        self.stop_at = cfg.max_steps if cfg.max_steps != -1 else float("inf")
        check_window_saves(t, val_every)
        batches, start = epoch_iterator(t)
        t.session.train_iterator = batches  # as Lightning: the last epoch's workers end as this one starts
        if t.profiler is not None:  # each fetch timed under Lightning's key
            batches = t.profiler.fetches("[_TrainingEpochLoop].train_dataloader_next", batches)
        if state.val_pending:  # resumed from a checkpoint written just before a mid-epoch validation
            state.val_pending = False
            validate(t, start, self.k)
        comm = t.strategy.comm
        self.n = n = comm.agree_num_batches(t.num_training_batches)  # uneven ranks: all run the shortest
        self.known = n != float("inf")
        self.closure = Closure(t) if automatic else None
        self.cudagraphs = bool(getattr(t.session, "cudagraphs", False))
        self.batch_start = hooks.caller("on_train_batch_start", result=True)  # its -1 ends the epoch
        self.batch_ends = hooks.callers("on_train_batch_end")
        self.start = start
        self.plateau_steps = automatic and any(
            c.is_plateau and c.interval == "step" for c in t.lr_scheduler_configs
        )
        # the last batch stepped: its step-interval plateau schedulers wait for its validation
        self.plateau_due = False
        self.cut = self.out_of_data = self.ran_out_in_step = False
        # a `dataloader_iter` step reads the batches itself (loop/loader_iter.py)
        self.loader_iter = training_feed(batches, n, start) if takes_loader_iter(task.training_step) else None
        store.iter_training = self.loader_iter is not None
        if self.loader_iter is not None:
            check_world_size(t, n, "training_step")
        move = functools.partial(to_device, t) if t.hooks.transfer else batch_mover(t.strategy)
        joins = comm.joins() if not self.known and self.loader_iter is None else None
        loader = t.loaders["train"][0]  # (a CombinedLoader when several were given: loop/combined.py)
        self.batches = feed(batches, n, start, move, map_style(loader), joins, self.loader_iter)
        self.step = self._pick_step()
        self.after_step = self._after_step()
        if self.loader_iter is not None:  # the step gets the iterator, the hooks the batch it fetched last
            self.step = functools.partial(_reads_itself, self.step, self.loader_iter)
        store.fx = "training_step"  # self.log's rules inside a training batch (trainer/loggers/log_rules.py)
        open_batches(t)  # their step values reach trainer.logged_metrics when read (loggers/logged.py)

    # ----- the step of each configuration: step(data, hook_idx, batch_idx, last) -> what a manual step returned
    def _pick_step(self) -> Callable[[Any, int, int, bool], Any]:
        t, closure = self.t, self.closure
        if closure is None:
            return self._manual_step
        if self.k == 1:  # every batch is a window of its own (the closure's defaults)
            step = batch_stepper(t, closure)
            return step if t.profiler is None else _profiled(t, step)
        optimizer_step = stepper(t, closure)
        self._optimizer_step = optimizer_step if t.profiler is None else _profiled(t, optimizer_step)
        return self._window_step

    def _window_step(self, data: Any, hook_idx: int, batch_idx: int, last: bool) -> None:
        """A micro-batch of an accumulation window of k; only the window's last one steps the optimizer."""
        k, n, closure = self.k, self.n, self.closure
        assert closure is not None
        boundary = last or (batch_idx + 1) % k == 0
        in_window = batch_idx % k + 1
        # the epoch's last window may hold fewer than k micro-batches: average over those it has, so that k
        # micro-batches of b always equal one batch of k*b (unknown length: rescaled at its end)
        window = min(k, n - (batch_idx - batch_idx % k)) if self.known else k
        rescale = k / in_window if not self.known and last and in_window < k else 1.0
        closure.prepare(data, hook_idx, window, in_window == 1, boundary, rescale)
        if boundary:
            self._optimizer_step(hook_idx)
        else:
            closure()

    def _manual_step(self, data: Any, hook_idx: int, batch_idx: int, last: bool) -> Any:
        """The task steps its own optimizers (automatic_optimization = False)."""
        t = self.t
        if self.cudagraphs:  # a new step begins (trainer/compiler.py)
            mark_step()
        with t.strategy.autocast(), t.profile("training_step"):
            out = t.strategy.step(t.task, "training_step", data, hook_idx)
        if out is not None and not self.batch_ends:  # (else manual_outputs checks it for the hook)
            manual_outputs(out)  # anything but a tensor, a dict or None is refused, as Lightning
        return out

    # ----- around the step ----------------------------------------------------------------------------
    def none_batch(self, batch_idx: int, last: bool) -> None:
        """The loader gave None: as Lightning, no batch_start and no step; on_train_batch_end gets None."""
        none_batch(self.t)
        self.state.batch_in_epoch = batch_idx + 1
        for batch_end in self.batch_ends:
            batch_end(None, None, batch_idx)
        if last and self.automatic:
            step_schedulers(self.t, "epoch", plateau=False)

    def cut_here(self) -> None:
        """on_train_batch_start returned -1: the epoch ends before this batch's step."""
        if self.automatic:  # drop a cut-short window's gradients, or they leak into the next step
            self.t.optimizers[0].zero_grad(set_to_none=True)
            step_schedulers(self.t, "epoch", plateau=False)  # as after an epoch's last batch
        self.cut = True

    def _after_step(self) -> Callable[[Any, Any, int, int, bool], bool]:
        """`after_step(out, batch, batch_idx, hook_idx, last)`: everything after a batch's step, in Lightning's
        order; True when the epoch stops here. A closure over what the epoch fixes, so a step reads locals."""
        run, t, state, closure, batch_ends = self, self.t, self.state, self.closure, self.batch_ends
        k = self.k
        automatic, val_every, timed, stop_at = self.automatic, self.val_every, self.timed, self.stop_at
        plateau_steps, check_stop, copies = self.plateau_steps, stop_checker(t), self.cudagraphs
        # the next batch count that validates (0: none), the last global step whose stop was agreed, and the
        # next global step that may log (the next multiple of log_every_n_steps)
        val_at = (self.start // val_every + 1) * val_every if val_every else 0
        checked, log_at = state.global_step, _next_log(state.global_step, self.log_every)

        def after_step(out: Any, batch: Any, batch_idx: int, hook_idx: int, last: bool) -> bool:
            nonlocal val_at, checked, log_at
            done = state.batch_in_epoch = batch_idx + 1
            if last and automatic:  # Lightning steps the epoch's other schedulers after its last batch
                step_schedulers(t, "epoch", plateau=False)
            if done == val_at:  # every val_every batches
                val_at += val_every
                validate_now = not last
            else:
                validate_now = timed is not None and run._time_due(last)
            state.val_pending = validate_now  # (a checkpoint written in on_train_batch_end records it)
            if batch_ends:
                outputs = closure.outputs() if closure is not None else manual_outputs(out, copies)
                for batch_end in batch_ends:
                    batch_end(outputs, batch, hook_idx)
            global_step = state.global_step
            if global_step >= log_at:
                log_at = run._log_step(global_step)
            if validate_now:
                state.val_pending = False
                validate(t, done, k)
            if global_step != checked:  # a step boundary: the ranks agree on a stop request
                checked = global_step
                # as Lightning: the step-interval plateau schedulers after this batch's validation
                if plateau_steps:
                    run.plateau_due = last
                    if not last:  # (the last batch validates at the epoch's end)
                        step_schedulers(t, "step", plateau=True)
                check_stop()
            # a stop request or max_steps ends the epoch, never inside an accumulation window (its gradients
            # would be lost) and not at its last batch (the epoch's end runs)
            if (state.should_stop or global_step >= stop_at) and not last:
                return run._stops_here(done, validate_now)
            return False

        return after_step

    def _time_due(self, last: bool) -> bool:
        """A wall-time val_check_interval has passed (not at the epoch's last batch, which validates anyway)."""
        return not last and should_validate(self.t) and time_due(self.t, self.timed)  # type: ignore[arg-type]

    def _log_step(self, global_step: int) -> float:
        """Send this step's values to the loggers when log_every_n_steps says so (once per optimizer step; 0:
        never, as Lightning); the next global step that may log. Between logging steps the values stay tensors
        in the store, read back lazily as trainer.logged_metrics (trainer/loggers/logged.py)."""
        state, log_every = self.state, self.log_every
        if log_every and global_step % log_every == 0 and global_step != state.last_logged_step:
            state.last_logged_step = global_step
            log_metrics(self.t, self.store.step_metrics())
        return _next_log(global_step + 1, log_every)

    def _stops_here(self, done: int, validated: bool) -> bool:
        """should_stop or max_steps after batch `done`: the epoch ends here unless an accumulation window is
        open."""
        t = self.t
        if self.automatic and done % self.k:
            return False
        if stop_requested(t):  # as Lightning: a stop asked mid-epoch validates first
            if should_validate(t) and not validated:
                validate(t, done, self.k)
            return True
        return max_steps_reached(t)

    def end(self) -> None:
        """The epoch's end: its validation when due, on_train_epoch_end, the epoch's metrics and schedulers."""
        t, state, hooks = self.t, self.state, self.t.hooks
        # a stop requested in the epoch's last steps: every rank stops here, after its last batch
        settle_stop(t)
        self.batches.close()  # (a feed left early settles what it has in flight)
        close_batches(t)
        state.epoch_finished = self.cut or self.out_of_data
        # the end validates if the interval ends there (Lightning: 0.3 validates at 30, 60, 90%) or has no length
        every = self.val_every
        due = not every or not self.known or self.loader_iter is not None or state.batch_in_epoch % every == 0
        ends = state.epoch_finished and not self.cut and not self.ran_out_in_step and should_validate(t)
        if ends and (due if self.timed is None else time_due(t, self.timed)):
            validate(t, state.batch_in_epoch, self.k, final=True)
        if self.plateau_due:
            step_schedulers(t, "step", plateau=True)
        self.store.fx = None  # the training batches are over
        hooks.call("on_train_epoch_end", monitoring=False)  # the task and plain callbacks may still log
        log_metrics(t, self.store.epoch_end())  # so that checkpointing and early stopping see the aggregates
        hooks.call("on_train_epoch_end", monitoring=True)
        if not state.epoch_finished:  # stopped inside the epoch: a resume continues it
            return
        if self.automatic:  # the plateau schedulers after the epoch's metrics (manual: the task steps them)
            step_schedulers(t, "epoch", plateau=True)
        if t.session.recompiles is not None:  # type: ignore[union-attr]  # torch.compile: say why it recompiles
            t.session.recompiles.check(f"by the end of epoch {state.epoch}")  # type: ignore[union-attr]
        state.next_epoch()


def _profiled(t: Trainer, step: Callable[..., Any]) -> Callable[..., Any]:
    """An optimizer step timed under the profiler's "optimizer_step"."""

    def profiled(*args: Any) -> Any:
        with t.profile("optimizer_step"):
            return step(*args)

    return profiled


def _reads_itself(step: Callable[..., Any], loader_iter: Any, batch: Any, *args: Any) -> Any:
    return step(loader_iter, *args)


def _next_log(step: int, every: int) -> float:
    """The first multiple of `every` from `step` on (never, when `every` is 0)."""
    return -(-step // every) * every if every else float("inf")


def validate(t: Trainer, done: int, k: int, final: bool = False) -> None:
    """A validation inside fit; the task's gradients are released first unless a window is open (the epoch's
    last batch closes its window even when it holds fewer than k batches: `final`, as Lightning)."""
    load_val(t)  # (again when reload_dataloaders_every_n_epochs says so)
    if t.task.automatic_optimization is False or final or done % k == 0:  # type: ignore[union-attr]
        if "on_validation_model_zero_grad" in t.hooks.custom:
            run_as(t, "on_validation_model_zero_grad", t.task.on_validation_model_zero_grad)  # type: ignore[union-attr]
        else:
            t.task.zero_grad()  # type: ignore[union-attr]
    run_eval(t, "val")
    t.metric_store.fx = "training_step"  # back inside the training batch
    t.session.last_val_time = time.monotonic()  # type: ignore[union-attr]


def max_steps_reached(t: Trainer) -> bool:
    return t.config.max_steps != -1 and t.state.global_step >= t.config.max_steps


def stop_requested(t: Trainer) -> bool:
    """should_stop counts only once min_epochs and min_steps are reached (as in Lightning)."""
    cfg, state = t.config, t.state
    min_ok = (cfg.min_epochs is None or state.epoch >= cfg.min_epochs) and (
        cfg.min_steps is None or state.global_step >= cfg.min_steps
    )
    if state.should_stop and not min_ok and not t.session.min_noted:  # type: ignore[union-attr]
        t.session.min_noted = True  # type: ignore[union-attr]
        rank_zero_info(
            f"A stop was requested, but min_epochs={cfg.min_epochs} or min_steps={cfg.min_steps} is not reached "
            "yet: training goes on until both are."
        )
    return state.should_stop and min_ok
