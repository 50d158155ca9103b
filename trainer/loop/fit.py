"""The training loop: `fit` and `train_epoch`, readable in one place. It reads and advances the run's
LoopState (trainer.state), calls hooks through trainer.hooks, and drives the strategy's small contract."""

from __future__ import annotations

import warnings
from itertools import count, islice
from typing import TYPE_CHECKING, Any

import torch

from trainer.checkpoint.run import check_window_saves
from trainer.errors import TaskError
from trainer.loggers.reporting import finalize_loggers, log_metrics
from trainer.loop.data import SkipBatchSampler, rebuild, rebuildable, set_epoch
from trainer.loop.evaluation import run_eval
from trainer.loop.optim import optimizer_step, step_schedulers
from trainer.loop.signals import check_stop
from trainer.loop.transfer import to_device
from trainer.seed import get_rng_state, set_rng_state

if TYPE_CHECKING:
    from trainer.trainer import Trainer

_END = object()  # the epoch's iterator is exhausted


def fit(t: Trainer) -> None:
    """Sanity-check validation, then epochs until max_epochs, max_steps or a stop request."""
    cfg, state, hooks = t.config, t.state, t.hooks
    hooks.call("on_fit_start")
    if cfg.num_sanity_val_steps and t.val_dataloaders:
        rng = get_rng_state()  # isolated, as in Lightning: the check must not change what training draws
        state.sanity_checking = True
        hooks.call("on_sanity_check_start")
        run_eval(t, "val", limit=None if cfg.num_sanity_val_steps == -1 else cfg.num_sanity_val_steps)
        hooks.call("on_sanity_check_end")
        state.sanity_checking = False
        t.metric_store.callback_metrics.clear()
        set_rng_state(rng)
    if state.resume_rng is not None and state.batch_in_epoch == 0:  # resuming at an epoch boundary
        set_rng_state(state.resume_rng)
        state.resume_rng = None
    hooks.call("on_train_start")
    _warn_if_no_steps(t)
    while not _done(t):
        if cfg.reload_dataloaders_every_n_epochs and state.epoch and not state.batch_in_epoch:
            if state.epoch % cfg.reload_dataloaders_every_n_epochs == 0:
                t.session.reload()  # type: ignore[union-attr]  # *_dataloader() are asked again
        train_epoch(t)
    hooks.call("on_train_end")
    hooks.call("on_fit_end")
    finalize_loggers(t, "success")


def train_epoch(t: Trainer) -> None:
    """One training epoch: the loop every strategy shares (see DESIGN.md, 'How a batch flows')."""
    cfg, state, hooks, strategy, task = t.config, t.state, t.hooks, t.strategy, t.task
    assert task is not None
    optimizer = t.optimizers[0] if task.automatic_optimization else None
    val_every = _val_check_batches(t) if _should_validate(t) else 0  # check_val_every_n_epoch gates it too
    set_epoch(t.train_dataloader, state.epoch)
    task.train()
    state.phase = "train"
    t.metric_store.reset("train")
    hooks.call("on_train_epoch_start")
    k = t.config.accumulate_grad_batches  # after the hook: GradientAccumulationScheduler may change it
    check_window_saves(t, val_every)
    batches, start = _epoch_iterator(t)
    if state.val_pending:  # resumed from a checkpoint written just before a mid-epoch validation: run it now
        state.val_pending = False
        run_eval(t, "val")
    n = strategy.comm.agree_num_batches(t.num_training_batches)  # uneven ranks: all run the shortest epoch
    checked = state.global_step
    for batch_idx in range(start, n) if n != float("inf") else count(start):
        batch = next(batches, _END)
        if not strategy.comm.join(batch is not _END):  # some rank is out of data (unknown lengths only)
            break
        batch = to_device(t, batch)
        t.metric_store.set_batch(batch)
        if hooks.call("on_train_batch_start", batch, batch_idx) == -1:
            if optimizer is not None:  # drop a cut-short window's gradients, or they leak into the next step
                optimizer.zero_grad(set_to_none=True)
            break
        with strategy.autocast(), t.profile("training_step"):
            out = strategy.step(task, "training_step", batch, batch_idx)
        if optimizer is not None:  # automatic optimization (else the task stepped its own optimizers)
            boundary = (batch_idx + 1) % k == 0 or batch_idx + 1 == n
            # the epoch's last window may hold fewer than k micro-batches: average over those it has,
            # so that k micro-batches of b always equal one batch of k*b (the last one smaller too)
            window = min(k, n - (batch_idx - batch_idx % k))
            loss = _loss_of(out, t.world_size)  # None: the task skips this batch
            if batch_idx % k == 0:  # a window starts: Lightning's moment to zero the gradients
                _zero_grad(t, optimizer, batch_idx)
            if loss is not None and (cfg.detect_nonfinite == "off" or not _nonfinite(t, loss, batch_idx)):
                hooks.call("on_before_backward", loss)
                run = task.backward if "backward" in hooks.custom else None
                with t.profile("backward"):
                    strategy.backward(loss / window if window > 1 else loss, sync=boundary, run=run)
                hooks.call("on_after_backward")
            if boundary:  # (a skipped batch still counts as a step, as in Lightning, but steps nothing)
                with t.profile("optimizer_step"):
                    _step(t, optimizer, batch_idx, loss)
        state.batch_in_epoch = batch_idx + 1
        validate_now = bool(val_every) and (batch_idx + 1) % val_every == 0 and batch_idx + 1 != n
        state.val_pending = (
            validate_now  # a checkpoint written in on_train_batch_end records the due validation
        )
        hooks.call("on_train_batch_end", out, batch, batch_idx)
        if state.global_step % cfg.log_every_n_steps == 0 and state.global_step != state.last_logged_step:
            state.last_logged_step = state.global_step
            log_metrics(t, t.metric_store.step_metrics())
        if validate_now:
            state.val_pending = False
            run_eval(t, "val")
        if state.global_step != checked:  # a step boundary: the ranks agree on a stop request
            checked = state.global_step
            check_stop(t)
        # never stop inside an accumulation window (its gradients would be lost)
        at_boundary = optimizer is None or (batch_idx + 1) % k == 0
        if at_boundary and (_stop_requested(t) or _max_steps_reached(t)) and batch_idx + 1 < n:
            return  # stopped mid-epoch: the epoch is not finished, resume continues it
    if optimizer is not None and state.batch_in_epoch % k and n == float("inf"):
        _step_partial_window(t, optimizer)  # an unknown-length epoch ended inside an accumulation window
    state.epoch_finished = True
    if _should_validate(t):
        run_eval(t, "val")
    t.metric_store.in_epoch_hook = True
    hooks.call("on_train_epoch_end", monitoring=False)  # the task and plain callbacks may still log
    log_metrics(t, t.metric_store.epoch_end())  # so that checkpointing and early stopping see the aggregates
    hooks.call("on_train_epoch_end", monitoring=True)
    t.metric_store.in_epoch_hook = False
    if task.automatic_optimization:  # under manual optimization the task steps its schedulers itself
        step_schedulers(t, "epoch")
    if t.session.recompiles is not None:  # type: ignore[union-attr]  # torch.compile: say why it recompiles
        t.session.recompiles.check(f"by the end of epoch {state.epoch}")  # type: ignore[union-attr]
    state.next_epoch()


def _step(
    t: Trainer, optimizer: torch.optim.Optimizer, batch_idx: int, loss: torch.Tensor | None = None
) -> None:
    """One optimizer step of automatic optimization (through the task's optimizer_step if it has one),
    then the step-interval schedulers."""
    task, state = t.task, t.state
    assert task is not None
    if "optimizer_step" in t.hooks.custom:  # the closure hands back this batch's already computed loss
        task.optimizer_step(state.epoch, batch_idx, task._optimizers[0], lambda: loss)
    else:
        if loss is not None:
            optimizer_step(t, optimizer)
        state.global_step += 1
    step_schedulers(t, "step")


def _zero_grad(t: Trainer, optimizer: torch.optim.Optimizer, batch_idx: int) -> None:
    t.hooks.call("on_before_zero_grad", optimizer)
    if "optimizer_zero_grad" in t.hooks.custom:
        t.task.optimizer_zero_grad(t.state.epoch, batch_idx, optimizer)  # type: ignore[union-attr]
    else:
        optimizer.zero_grad(set_to_none=True)


def _step_partial_window(t: Trainer, optimizer: torch.optim.Optimizer) -> None:
    """Step on the micro-batches of a window the data cut short (their backward did not synchronize).

    Their losses were divided by k before the length was known; rescale so the window averages over the
    micro-batches it has, the same rule as a known-length epoch's last window."""
    k = t.config.accumulate_grad_batches
    have = t.state.batch_in_epoch % k
    with torch.no_grad():
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.grad.mul_(k / have)
    _step(t, optimizer, t.state.batch_in_epoch - 1)


def _warn_if_no_steps(t: Trainer) -> None:
    """A fit that will take no optimizer step says why (it still ends normally: that may be what was asked)."""
    cfg, n = t.config, t.num_training_batches
    reason = (
        "max_steps=0" if cfg.max_steps == 0
        else "max_epochs=0" if cfg.max_epochs == 0
        else "limit_train_batches=0" if cfg.limit_train_batches in (0, 0.0)
        else "the training loader is empty" if n == 0
        else None
    )  # fmt: skip
    if reason is not None and t.is_global_zero:
        warnings.warn(f"fit() will take no optimizer step: {reason}.", UserWarning, stacklevel=2)


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


def _nonfinite(t: Trainer, loss: torch.Tensor, batch_idx: int) -> bool:
    """detect_nonfinite: True to skip this micro-batch's backward; raises under "raise". Costs a host sync
    (and, with several ranks, a 1-element all-reduce so that every rank skips the same step)."""
    bad = t.strategy.comm.any_rank(not bool(torch.isfinite(loss.detach())))
    if bad and t.config.detect_nonfinite == "raise":
        raise TaskError(
            f"training loss is {loss.item()} at global step {t.state.global_step} (epoch {t.state.epoch}, batch "
            f"{batch_idx}) on rank {t.global_rank} or another rank; lower the learning rate, clip gradients, or "
            "pass detect_nonfinite='skip' to skip such batches."
        )
    return bad


def _epoch_iterator(t: Trainer) -> tuple[Any, int]:
    """Iterator over this epoch's batches and the index of its first batch (non-zero when resuming).

    Resuming mid-epoch replays the epoch's random draws from the RNG state saved at its start, then skips
    the consumed batches in the batch sampler (indices only, no data is read), then restores the RNG
    state of the moment the checkpoint was taken; the rest of the epoch is identical to an uninterrupted run.
    """
    state, loader = t.state, t.train_dataloader
    skip = state.batch_in_epoch
    if not (skip and state.resume_rng is not None and state.epoch_start_rng is not None):
        state.epoch_start_rng = get_rng_state()
        return iter(loader), 0
    set_rng_state(state.epoch_start_rng)
    if rebuildable(loader) and loader.batch_sampler is not None:
        sampler = SkipBatchSampler(loader.batch_sampler, skip)
        it = iter(rebuild(loader, batch_sampler=sampler))
        sampler.prime()
    else:  # iterable data sets cannot skip by index: read and drop the consumed batches
        it = iter(loader)
        for _ in islice(it, skip):
            pass
    set_rng_state(state.resume_rng)
    state.resume_rng = None
    return it, skip


def _loss_of(out: Any, world_size: int) -> torch.Tensor | None:
    """The loss in training_step's output; None (Lightning's "skip this batch") only on one process."""
    if out is None:
        if world_size > 1:
            raise TaskError(
                "training_step returned None (skip this batch) under several processes: the other ranks would "
                "wait for this one's gradients. Skip batches on one process only, or return a zero loss instead."
            )
        return None
    loss = out.get("loss") if isinstance(out, dict) else out
    if not isinstance(loss, torch.Tensor):
        raise TaskError(
            f"training_step returned {type(out).__name__}; return the loss tensor, a dict with key 'loss', or None "
            "to skip the batch (or set self.automatic_optimization = False and step the optimizer yourself)."
        )
    if loss.ndim != 0:
        raise TaskError(
            f"training_step returned a loss of shape {tuple(loss.shape)}; reduce it to a scalar (e.g. .mean())."
        )
    if not loss.requires_grad:
        raise TaskError(
            "training_step returned a loss that does not require grad; compute it from the model's output."
        )
    return loss


def _val_check_batches(t: Trainer) -> int:
    """Run validation every this many training batches inside the epoch (0: only at the epoch's end)."""
    v = t.config.val_check_interval
    if not t.val_dataloaders or (isinstance(v, float) and v == 1.0):
        return 0
    if isinstance(v, float):
        n = t.num_training_batches
        if n == float("inf"):
            raise TaskError(
                "val_check_interval as a fraction needs a training loader with a length; pass an int."
            )
        return max(1, int(n * v))
    return int(v)


def _should_validate(t: Trainer) -> bool:
    every = t.config.check_val_every_n_epoch
    return bool(t.val_dataloaders) and (every is None or (t.state.epoch + 1) % every == 0)
