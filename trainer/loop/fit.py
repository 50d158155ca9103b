"""The training loop: `fit` and `train_epoch`, readable in one place. It reads and advances the run's
LoopState (trainer.state), calls hooks through trainer.hooks, and drives the strategy's small contract."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from itertools import islice
from typing import TYPE_CHECKING, Any

import torch

from strategies.base import batch_mover
from strategies.checkpoint.io import checkpoint_io
from strategies.data.reinit import rebuild, rebuildable
from strategies.fault_tolerance import join_replicas
from tandem_core.rank_zero import rank_zero_warn
from trainer import checkpoint
from trainer.checkpoint.live import LiveState
from trainer.checkpoint.run import check_window_saves
from trainer.loggers.logged import forget, remember
from trainer.loggers.reporting import finalize_loggers, log_metrics, log_stage_start
from trainer.loop.closure import Closure, manual_outputs
from trainer.loop.combined import epoch_iterator as combined_epoch
from trainer.loop.data import SkipBatchSampler, set_epoch
from trainer.loop.evaluation import run_eval
from trainer.loop.fit_gate import loads_train, skips_training, warn_if_no_steps
from trainer.loop.hooks import run_as
from trainer.loop.loader_iter import check_world_size, takes_loader_iter, training_feed
from trainer.loop.optim import step_schedulers
from trainer.loop.signals import check_stop
from trainer.loop.stepper import eval_modules_message, none_batch, stepper
from trainer.loop.transfer import to_device
from trainer.loop.val_schedule import should_validate, time_due, val_check_batches, val_check_seconds
from trainer.seed import get_rng_state, set_rng_state
from trainer.utilities.combined_loader import CombinedLoader
from trainer.utilities.enums import PossibleUserWarning

if TYPE_CHECKING:
    from trainer.trainer import Trainer

_END = object()  # the epoch's iterator is exhausted


def fit(t: Trainer) -> None:
    """Sanity-check validation, then epochs until max_epochs, max_steps or a stop request."""
    cfg, state, hooks, session, task = t.config, t.state, t.hooks, t.session, t.task
    assert session is not None and task is not None
    state.resume_cut_epoch()  # fit again on the same trainer: the epoch it stopped inside goes on
    hooks.call("on_fit_start")
    log_stage_start(t)  # hyperparameters and graph: as Lightning, before the training state is restored
    if session.restoring is not None:  # as Lightning: optimizer and loop states after on_fit_start
        checkpoint.restore(t, session.restoring)
    join_replicas(t.strategy, LiveState(t))  # fault tolerance: a group behind takes a live peer's state
    task.zero_grad()  # as Lightning, at the start of every stage
    if state.window_grads is not None:  # resumed inside an accumulation window: its gradients so far
        checkpoint_io(t.strategy).set_window_grads(task, state.window_grads)
        state.window_grads = None
    if cfg.num_sanity_val_steps and session.val_enabled:
        rng = get_rng_state()  # isolated, as in Lightning: the check must not change what training draws
        # resumed from an epoch's end: Lightning counts that epoch as done only once training goes on
        ended = int(
            session.restoring is not None
            and bool(session.restoring.ckpt.get("loop", {}).get("epoch_finished"))
        )
        state.epoch -= ended
        state.sanity_checking = True
        hooks.call("on_sanity_check_start")
        session.load("val")
        run_eval(t, "val", limit=None if cfg.num_sanity_val_steps == -1 else cfg.num_sanity_val_steps)
        hooks.call("on_sanity_check_end")
        state.sanity_checking = False
        state.epoch += ended
        t.metric_store.callback_metrics.clear()
        t.metric_store.forget("val")  # the progress bar does not show the sanity check's values either
        forget(t)  # (what the sanity check's reads of trainer.logged_metrics gathered)
        set_rng_state(rng)
    if loads_train(t):  # (limit_train_batches=0: never asked for, as Lightning)
        session.load("train")
    if skips_training(t, _done(t)):  # as Lightning: over before its first batch, no training hooks run
        warn_if_no_steps(t)
        state.count_cut_epoch()
        hooks.call("on_fit_end")
        finalize_loggers(t, "success")
        return
    session.last_val_time = time.monotonic()  # a time-based val_check_interval counts from here (Lightning's)
    if session.val_enabled:  # Lightning asks for both before training starts
        session.load("val")
    if state.resume_rng is not None and state.batch_in_epoch == 0:  # resuming at an epoch boundary
        set_rng_state(state.resume_rng)
        state.resume_rng = None
    t.metric_store.open_run("train")  # what on_train_start logs joins the first epoch's aggregates
    if any(not m.training for m in task.modules()):  # (before on_train_start, as Lightning says it)
        rank_zero_warn(eval_modules_message(task), category=PossibleUserWarning)
    hooks.call("on_train_start")
    while not _done(t):
        if cfg.reload_dataloaders_every_n_epochs and state.epoch and not state.batch_in_epoch:
            if state.epoch % cfg.reload_dataloaders_every_n_epochs == 0:
                session.reload()  # *_dataloader() are asked again
        train_epoch(t)
    state.count_cut_epoch()
    hooks.call("on_train_end")
    hooks.call("on_fit_end")
    finalize_loggers(t, "success")


def train_epoch(t: Trainer) -> None:
    """One training epoch: the loop every strategy shares (see DESIGN.md, 'How a batch flows'). What does not
    change inside an epoch (the overridden hooks, the step path, the options) is looked up before its first
    batch, so a step pays only for what runs in it."""
    cfg, state, hooks, strategy, task, store = t.config, t.state, t.hooks, t.strategy, t.task, t.metric_store
    assert task is not None
    automatic = task.automatic_optimization
    val_every = val_check_batches(t) if should_validate(t) else 0  # check_val_every_n_epoch gates it too
    timed = val_check_seconds(t)  # a wall-time val_check_interval: validate once it has passed
    loader = t.loaders["train"][0]  # (a CombinedLoader when several were given: loop/combined.py)
    set_epoch(loader, state.epoch)
    state.phase = "train"
    store.start_epoch("train")
    if state.batch_in_epoch == 0:  # as Lightning: a run resumed inside an epoch does not start it again
        hooks.call("on_train_epoch_start")
    cfg = t.config  # again after the hook: GradientAccumulationScheduler may have changed it
    k, log_every, max_steps = cfg.accumulate_grad_batches, cfg.log_every_n_steps, cfg.max_steps
    log_every = 1 if cfg.fast_dev_run else log_every  # as Lightning: fast_dev_run logs every step
    check_window_saves(t, val_every)
    batches, start = _epoch_iterator(t)
    if t.profiler is not None:  # each fetch timed under Lightning's key
        batches = t.profiler.fetches("[_TrainingEpochLoop].train_dataloader_next", batches)
    if state.val_pending:  # resumed from a checkpoint written just before a mid-epoch validation: run it now
        state.val_pending = False
        _validate(t, start, k)
    n = strategy.comm.agree_num_batches(t.num_training_batches)  # uneven ranks: all run the shortest epoch
    known = n != float("inf")
    closure = Closure(t) if automatic else None
    step = stepper(t, closure) if closure is not None else None
    move = _mover(t)
    batch_start = hooks.caller("on_train_batch_start", result=True)  # its -1 ends the epoch
    batch_end = hooks.caller("on_train_batch_end")
    profiled = t.profiler is not None
    checked = state.global_step
    stop_at = max_steps if max_steps != -1 else float("inf")
    val_at = (start // val_every + 1) * val_every if val_every else 0  # the next batch count that validates
    batch_idx, cut, out_of_data = start - 1, False, False
    plateau_steps = automatic and any(c.is_plateau and c.interval == "step" for c in t.lr_scheduler_configs)
    plateau_due = (
        False  # the last batch stepped: its step-interval plateau schedulers wait for its validation
    )
    # Lightning's fetcher reads one batch ahead, so an iterable that changes state when it runs out is seen
    # at the same step. A map-style loader of known length is read at its step instead: the end is known
    # without reading, and random draws in the data set then keep their order for bit-identical resume.
    feed = training_feed(batches, n, start) if takes_loader_iter(task.training_step) else None
    store.iter_training = feed is not None
    if feed is not None:  # the step reads the batches itself (loop/loader_iter.py)
        check_world_size(t, n, "training_step")
    ahead = feed is None and (not known or not _map_style(loader))
    nxt = next(batches, _END) if ahead and (not known or start < n) else None
    hook_idx, in_step = 0, False  # the batch hooks' index; True once a step let StopIteration out
    store.fx = "training_step"  # self.log's rules inside a training batch (trainer/loggers/log_rules.py)
    while True:
        batch_idx += 1
        if feed is not None:  # a step per loop turn; its hooks see the batch fetched last (None at first)
            if feed.done or batch_idx >= n:
                out_of_data = True
                break
            batch, hook_idx, last = feed.batch, feed.batch_idx, batch_idx + 1 == n
        elif known:
            if batch_idx >= n:
                out_of_data = True
                break
            last = batch_idx + 1 == n
            batch = nxt if ahead else next(batches, _END)
            if batch is _END:
                out_of_data = True
                break
            if ahead:  # read one ahead only while there was data: an exhausted iterator is not asked again
                nxt = next(batches, _END) if not last else _END
        else:
            batch = nxt
            if not strategy.comm.join(batch is not _END):  # some rank is out of data: every rank ends
                out_of_data = True
                break
            nxt = next(batches, _END)
            last = not strategy.comm.join(nxt is not _END)
        if feed is None:
            hook_idx, batch = batch_idx, move(batch)
        store.set_batch(batch)
        if (
            batch is None and feed is None
        ):  # as Lightning: no batch_start, no step; on_train_batch_end gets None
            none_batch(t)
            done = state.batch_in_epoch = batch_idx + 1
            if batch_end is not None:
                batch_end(None, batch, batch_idx)
            if last and automatic:
                step_schedulers(t, "epoch", plateau=False)
            continue
        if batch_start is not None and batch_start(batch, hook_idx) == -1:  # the task ends the epoch here
            if automatic:  # drop a cut-short window's gradients, or they leak into the next step
                t.optimizers[0].zero_grad(set_to_none=True)
                step_schedulers(t, "epoch", plateau=False)  # as after an epoch's last batch
            cut = True
            break
        try:
            if closure is not None:  # automatic optimization (else the task steps its own optimizers)
                if k == 1:  # every batch is a window of its own (the closure's defaults)
                    closure.batch, closure.batch_idx, boundary = feed or batch, hook_idx, True
                else:
                    boundary = last or (batch_idx + 1) % k == 0
                    in_window = batch_idx % k + 1
                    # the epoch's last window may hold fewer than k micro-batches: average over those it has, so
                    # that k micro-batches of b always equal one batch of k*b (unknown length: rescaled at its end)
                    window = min(k, n - (batch_idx - batch_idx % k)) if known else k
                    rescale = k / in_window if not known and last and in_window < k else 1.0
                    closure.prepare(feed or batch, hook_idx, window, in_window == 1, boundary, rescale)
                if not boundary:
                    closure()
                elif profiled:
                    with t.profile("optimizer_step"):
                        step(hook_idx)  # type: ignore[misc]
                else:
                    step(hook_idx)  # type: ignore[misc]
            else:
                with strategy.autocast(), t.profile("training_step"):
                    out = strategy.step(task, "training_step", feed or batch, hook_idx)
                if (
                    out is not None and batch_end is None
                ):  # (else manual_outputs checks it for on_train_batch_end)
                    manual_outputs(out)  # anything but a tensor, a dict or None is refused, as Lightning
        except StopIteration:
            if feed is None:
                raise
            in_step = out_of_data = True  # the step found the data exhausted: the epoch ends here
            break
        if feed is not None:  # what the step fetched is what on_train_batch_end sees
            batch, hook_idx, last = feed.batch, feed.batch_idx, last or feed.done
        done = state.batch_in_epoch = batch_idx + 1
        if last and automatic:  # Lightning steps the epoch's other schedulers after its last batch
            step_schedulers(t, "epoch", plateau=False)
        if done == val_at:  # every val_every batches (none when val_every is 0: val_at stays 0)
            val_at += val_every
            validate_now = not last
        elif timed is not None:
            validate_now = not last and should_validate(t) and time_due(t, timed)
        else:
            validate_now = False
        # a checkpoint written in on_train_batch_end records the due validation
        state.val_pending = validate_now
        if batch_end is not None:
            batch_end(closure.outputs() if closure is not None else manual_outputs(out), batch, hook_idx)
        global_step = state.global_step
        # log_every_n_steps=0: no step logging (Lightning)
        if log_every and global_step % log_every == 0 and global_step != state.last_logged_step:
            state.last_logged_step = global_step
            log_metrics(t, store.step_metrics())
        else:  # not sent to the loggers, still trainer.logged_metrics (as Lightning)
            remember(t, store.step_metrics())
        if validate_now:
            state.val_pending = False
            _validate(t, done, k)
        if global_step != checked:  # a step boundary: the ranks agree on a stop request
            checked = global_step
            if plateau_steps:  # as Lightning: step-interval ReduceLROnPlateau after this batch's validation
                plateau_due = last
                if not last:  # (the last batch validates at the epoch's end, below)
                    step_schedulers(t, "step", plateau=True)
            check_stop(t)
        # a stop request or max_steps ends the epoch, never inside an accumulation window (its gradients
        # would be lost) and not at its last batch (the epoch's end runs)
        if (state.should_stop or global_step >= stop_at) and (not automatic or done % k == 0) and not last:
            if _stop_requested(t):  # as Lightning: a stop asked mid-epoch validates first
                if should_validate(t) and not validate_now:
                    _validate(t, done, k)
                break
            if _max_steps_reached(t):
                break
    state.epoch_finished = cut or out_of_data
    # the end validates if the interval ends there (Lightning: 0.3 validates at 30, 60, 90%) or has no length
    due = not val_every or not known or feed is not None or state.batch_in_epoch % val_every == 0
    ends = state.epoch_finished and not cut and not in_step and should_validate(t)
    if ends and (due if timed is None else time_due(t, timed)):
        _validate(t, state.batch_in_epoch, k, final=True)
    if plateau_due:
        step_schedulers(t, "step", plateau=True)
    store.fx = None  # the training batches are over
    hooks.call("on_train_epoch_end", monitoring=False)  # the task and plain callbacks may still log
    log_metrics(t, store.epoch_end())  # so that checkpointing and early stopping see the aggregates
    hooks.call("on_train_epoch_end", monitoring=True)
    if not state.epoch_finished:  # stopped inside the epoch: a resume continues it
        return
    if automatic:  # the plateau schedulers after the epoch's metrics (under manual the task steps them)
        step_schedulers(t, "epoch", plateau=True)
    if t.session.recompiles is not None:  # type: ignore[union-attr]  # torch.compile: say why it recompiles
        t.session.recompiles.check(f"by the end of epoch {state.epoch}")  # type: ignore[union-attr]
    state.next_epoch()


def _validate(t: Trainer, done: int, k: int, final: bool = False) -> None:
    """A validation inside fit; the task's gradients are released first unless a window is open (the epoch's
    last batch closes its window even when it holds fewer than k batches: `final`, as Lightning)."""
    t.session.load("val")  # type: ignore[union-attr]
    if t.task.automatic_optimization is False or final or done % k == 0:  # type: ignore[union-attr]
        if "on_validation_model_zero_grad" in t.hooks.custom:
            run_as(t, "on_validation_model_zero_grad", t.task.on_validation_model_zero_grad)  # type: ignore[union-attr]
        else:
            t.task.zero_grad()  # type: ignore[union-attr]
    run_eval(t, "val")
    t.metric_store.fx = "training_step"  # back inside the training batch
    t.session.last_val_time = time.monotonic()  # type: ignore[union-attr]


def _mover(t: Trainer) -> Callable[[Any], Any]:
    """`move(batch)`: the batch on the device, through the batch-transfer hooks where any is overridden."""
    if not t.hooks.transfer:
        return batch_mover(t.strategy)
    return functools.partial(to_device, t)


def _done(t: Trainer) -> bool:
    cfg = t.config
    return (
        _max_steps_reached(t)
        or (cfg.max_epochs != -1 and t.state.epoch >= cfg.max_epochs)
        or _stop_requested(t)
    )


def _max_steps_reached(t: Trainer) -> bool:
    return t.config.max_steps != -1 and t.state.global_step >= t.config.max_steps


def _stop_requested(t: Trainer) -> bool:
    """should_stop counts only once min_epochs and min_steps are reached (as in Lightning)."""
    cfg, state = t.config, t.state
    min_ok = (cfg.min_epochs is None or state.epoch >= cfg.min_epochs) and (
        cfg.min_steps is None or state.global_step >= cfg.min_steps
    )
    return state.should_stop and min_ok


def _epoch_iterator(t: Trainer) -> tuple[Any, int]:
    """Iterator over this epoch's batches and the index of its first batch (non-zero when resuming).

    Resuming mid-epoch replays the epoch's random draws from the RNG state saved at its start, then skips
    the consumed batches in the batch sampler (indices only, no data is read), then restores the RNG
    state of the moment the checkpoint was taken; the rest of the epoch is identical to an uninterrupted run.
    """
    state, loader = t.state, t.loaders["train"][0]
    skip = state.batch_in_epoch
    resuming = bool(skip and state.resume_rng is not None and state.epoch_start_rng is not None)
    if not resuming:
        state.epoch_start_rng = get_rng_state()
    if isinstance(loader, CombinedLoader):  # each inner loader replays and skips its part (loop/combined.py)
        it = combined_epoch(loader, state, skip if resuming else 0)
    elif not resuming:
        state.combined = None
        return iter(loader), 0
    elif rebuildable(loader) and loader.batch_sampler is not None:
        set_rng_state(state.epoch_start_rng)  # type: ignore[arg-type]
        sampler = SkipBatchSampler(loader.batch_sampler, skip)
        it = iter(rebuild(loader, batch_sampler=sampler))
        sampler.prime()
    else:  # iterable data sets cannot skip by index: read and drop the consumed batches
        set_rng_state(state.epoch_start_rng)  # type: ignore[arg-type]
        it = iter(loader)
        for _ in islice(it, skip):
            pass
    if not resuming:
        return it, 0
    set_rng_state(state.resume_rng)
    state.resume_rng = None
    return it, skip


def _map_style(loader: Any) -> bool:
    """A DataLoader over an indexable data set (its batches come from a batch sampler); for a CombinedLoader,
    each of its loaders."""
    if isinstance(loader, CombinedLoader):
        return all(_map_style(inner) for inner in loader.flattened)
    return getattr(loader, "batch_sampler", None) is not None and not isinstance(
        getattr(loader, "dataset", None), torch.utils.data.IterableDataset
    )
