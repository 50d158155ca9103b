"""The training loop: `fit` and `train_epoch`, readable in one place. It reads and advances the run's
LoopState (trainer.state), calls hooks through trainer.hooks, and drives the strategy's small contract."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from strategies.checkpoint.io import checkpoint_io
from strategies.fault_tolerance import join_replicas
from tandem_core.rank_zero import rank_zero_warn
from trainer import checkpoint
from trainer.checkpoint.live import LiveState
from trainer.loggers.logged import forget
from trainer.loggers.reporting import log_stage_start
from trainer.loop.epoch import EpochRun, max_steps_reached, stop_requested
from trainer.loop.evaluation import run_eval
from trainer.loop.fit_gate import (
    loads_train,
    skips_training,
    warn_if_epoch_shorter_than_logging,
    warn_if_no_steps,
)
from trainer.loop.stepper import eval_modules_message
from trainer.loop.val_schedule import load_val, should_validate
from trainer.seed import get_rng_state, set_rng_state
from trainer.utilities.enums import PossibleUserWarning

if TYPE_CHECKING:
    from trainer.trainer import Trainer


def fit(t: Trainer) -> None:
    """Sanity-check validation, then epochs until max_epochs, max_steps or a stop request."""
    cfg, state, hooks, session, task = t.config, t.state, t.hooks, t.session, t.task
    assert session is not None and task is not None
    state.resume_cut_epoch()  # fit again on the same trainer: the epoch it stopped inside goes on
    t.metric_store.drop_all()  # an earlier stage's metrics are not this fit's (as Lightning)
    forget(t)
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
        load_val(t)
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
        warn_if_epoch_shorter_than_logging(t)
    if skips_training(t, _done(t)):  # as Lightning: over before its first batch, no training hooks run
        warn_if_no_steps(t)
        state.count_cut_epoch()
        hooks.call("on_fit_end")
        return
    session.last_val_time = time.monotonic()  # a time-based val_check_interval counts from here (Lightning's)
    if should_validate(t):  # Lightning asks for both before training starts when its first epoch validates
        load_val(t)
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
                session.reload("train")  # train_dataloader() is asked again (validation's: load_val)
        train_epoch(t)
    state.count_cut_epoch()
    hooks.call("on_train_end")
    hooks.call("on_fit_end")


def train_epoch(t: Trainer) -> None:
    """One training epoch: the loop every strategy shares (see DESIGN.md, 'How a batch flows'). What does not
    change inside an epoch (the feed of batches, the step function of this configuration, the overridden
    hooks, the options) is picked before its first batch (trainer/loop/epoch.py), so a step pays only for
    what runs in it."""
    run = EpochRun(t)
    store, step, after_step, batch_start = t.metric_store, run.step, run.after_step, run.batch_start
    stepped = run.loader_iter  # a `dataloader_iter` step's iterator (trainer/loop/loader_iter.py), else None
    for batch_idx, batch, hook_idx, last in run.batches:  # (trainer/loop/feeds.py: on the device already)
        store.set_batch(batch)
        if batch is None and stepped is None:  # as Lightning: no batch_start, no step
            run.none_batch(batch_idx, last)
            continue
        if batch_start is not None and batch_start(batch, hook_idx) == -1:  # the task ends the epoch here
            run.cut_here()
            break
        try:
            out = step(batch, hook_idx, batch_idx, last)  # (a dataloader_iter step gets the iterator)
        except StopIteration:
            if stepped is None:
                raise
            run.ran_out_in_step = run.out_of_data = True  # a dataloader_iter step found the data exhausted
            break
        if stepped is not None:  # what the step fetched is what on_train_batch_end sees
            batch, hook_idx, last = stepped.batch, stepped.batch_idx, last or stepped.done
        if after_step(out, batch, batch_idx, hook_idx, last):  # validation, logging, stop agreement
            break
    else:
        run.out_of_data = True
    run.end()


def _done(t: Trainer) -> bool:
    cfg = t.config
    return (
        max_steps_reached(t)
        or (cfg.max_epochs != -1 and t.state.epoch >= cfg.max_epochs)
        or stop_requested(t)
    )
