"""The loops. Training is one visible function, `train_epoch`; evaluation and prediction share `run_eval`."""

from __future__ import annotations

import re
import signal
import sys
from itertools import count, islice
from typing import TYPE_CHECKING, Any

import torch

from trainer.data import SkipBatchSampler, rebuild, rebuildable, set_epoch
from trainer.errors import TaskError
from trainer.optim import step_schedulers
from trainer.seed import get_rng_state, set_rng_state

if TYPE_CHECKING:
    from trainer.trainer import Trainer

_END = object()  # the epoch's iterator is exhausted


def fit(trainer: Trainer) -> None:
    """Sanity-check validation, then epochs until max_epochs, max_steps or a stop request."""
    t, cfg = trainer, trainer.config
    t._call("on_fit_start")
    if cfg.num_sanity_val_steps and t.val_dataloaders:
        t.sanity_checking = True
        t._call("on_sanity_check_start")
        limit = None if cfg.num_sanity_val_steps == -1 else cfg.num_sanity_val_steps
        run_eval(t, "val", limit=limit)
        t._call("on_sanity_check_end")
        t.sanity_checking = False
        t._metrics.callback_metrics.clear()
    if t._resume_rng is not None and t.batch_in_epoch == 0:  # resuming at an epoch boundary
        set_rng_state(t._resume_rng)
        t._resume_rng = None
    t._call("on_train_start")
    while not _done(t):
        train_epoch(t)
    t._call("on_train_end")
    t._call("on_fit_end")
    t._finalize_loggers("success")


def _done(t: Trainer) -> bool:
    cfg = t.config
    return (
        _max_steps_reached(t)
        or (cfg.max_epochs != -1 and t.current_epoch >= cfg.max_epochs)
        or _stop_requested(t)
    )


def _max_steps_reached(t: Trainer) -> bool:
    return t.config.max_steps != -1 and t.global_step >= t.config.max_steps


def _stop_requested(t: Trainer) -> bool:
    """should_stop counts only once min_epochs and min_steps are reached (as in Lightning)."""
    cfg = t.config
    min_ok = (cfg.min_epochs is None or t.current_epoch >= cfg.min_epochs) and (
        cfg.min_steps is None or t.global_step >= cfg.min_steps
    )
    return t.should_stop and min_ok


def train_epoch(trainer: Trainer) -> None:
    """One training epoch: the loop every strategy shares (see DESIGN.md, 'How a batch flows')."""
    t, cfg, strategy, task = trainer, trainer.config, trainer.strategy, trainer.task
    assert task is not None
    k, n = cfg.accumulate_grad_batches, t.num_training_batches
    optimizer = t.optimizers[0] if task.automatic_optimization else None
    val_every = _val_check_batches(t) if _should_validate(t) else 0  # check_val_every_n_epoch gates it too
    set_epoch(t.train_dataloader, t.current_epoch)
    task.train()
    t._metrics.reset("train")
    t._call("on_train_epoch_start")
    batches, start = _epoch_iterator(t)
    if t.val_pending:  # resumed from a checkpoint written just before a mid-epoch validation: run it now
        t.val_pending = False
        run_eval(t, "val")
    n = strategy.agree_num_batches(n)  # uneven ranks: everyone runs the shortest epoch
    checked = t.global_step
    for batch_idx in range(start, n) if n != float("inf") else count(start):
        batch = next(batches, _END)
        if not strategy.join(batch is not _END):  # some rank is out of data (unknown lengths only)
            break
        batch = strategy.batch_to_device(batch)
        t._metrics.set_batch(batch)
        if t._call("on_train_batch_start", batch, batch_idx) == -1:
            if optimizer is not None:  # drop a cut-short window's gradients, or they leak into the next step
                optimizer.zero_grad(set_to_none=True)
            break
        if optimizer is not None:
            boundary = (batch_idx + 1) % k == 0 or batch_idx + 1 == n
            # the epoch's last window may hold fewer than k micro-batches: average over those it has,
            # so that k micro-batches of b always equal one batch of k*b (the last one smaller too)
            window = min(k, n - (batch_idx - batch_idx % k))
            with strategy.no_sync(enabled=not boundary):
                with strategy.precision.autocast():
                    out = strategy.training_step(task, batch, batch_idx)
                loss = _loss_of(out)
                if cfg.detect_nonfinite == "off" or not _nonfinite(t, loss, batch_idx):
                    t._call("on_before_backward", loss)
                    strategy.backward(loss / window if window > 1 else loss)
                    t._call("on_after_backward")
            if boundary:
                _step(t, optimizer)
        else:  # manual optimization: the task steps its own optimizers
            with strategy.precision.autocast():
                out = strategy.training_step(task, batch, batch_idx)
        t.batch_in_epoch = batch_idx + 1
        validate_now = bool(val_every) and (batch_idx + 1) % val_every == 0 and batch_idx + 1 != n
        t.val_pending = validate_now  # a checkpoint written in on_train_batch_end records the due validation
        t._call("on_train_batch_end", out, batch, batch_idx)
        if t.global_step % cfg.log_every_n_steps == 0 and t.global_step != t._last_logged_step:
            t._last_logged_step = t.global_step
            t._log(t._metrics.step_metrics())
        if validate_now:
            t.val_pending = False
            run_eval(t, "val")
        if t.global_step != checked and t.global_step % strategy.stop_check_interval == 0:
            checked = t.global_step  # ranks agree on a stop request once per so many optimizer steps
            if strategy.any_rank(t.stop_signal is not None):
                _stop_on_signal(t)
        # never stop inside an accumulation window (its gradients would be lost)
        at_boundary = optimizer is None or (batch_idx + 1) % k == 0
        if at_boundary and (_stop_requested(t) or _max_steps_reached(t)) and batch_idx + 1 < n:
            return  # stopped mid-epoch: the epoch is not finished, resume continues it
    if optimizer is not None and t.batch_in_epoch % k and n == float("inf"):
        _step_partial_window(t, optimizer)  # an unknown-length epoch ended inside an accumulation window
    t.epoch_finished = True
    if _should_validate(t):
        run_eval(t, "val")
    t._metrics.in_epoch_hook = True
    t._call("on_train_epoch_end", monitoring=False)  # the task and plain callbacks may still log
    t._log(t._metrics.epoch_end())  # so that checkpointing and early stopping see this epoch's aggregates
    t._call("on_train_epoch_end", monitoring=True)
    t._metrics.in_epoch_hook = False
    if task.automatic_optimization:  # under manual optimization the task steps its schedulers itself
        step_schedulers(t, "epoch")
    t.current_epoch += 1
    t.batch_in_epoch, t.epoch_finished = 0, False


def _step_partial_window(t: Trainer, optimizer: torch.optim.Optimizer) -> None:
    """Step on the micro-batches of a window the data cut short (their backward did not synchronize).

    Their losses were divided by k before the length was known; rescale so the window averages over the
    micro-batches it has, the same rule as a known-length epoch's last window."""
    k, have = t.config.accumulate_grad_batches, t.batch_in_epoch % t.config.accumulate_grad_batches
    with torch.no_grad():
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.grad.mul_(k / have)
    _step(t, optimizer)


def _step(t: Trainer, optimizer: torch.optim.Optimizer) -> None:
    """One optimizer step of automatic optimization: reduce, step, zero the grads, count, schedule."""
    t._optimizer_step(optimizer)
    t._call("on_before_zero_grad", optimizer)
    optimizer.zero_grad(set_to_none=True)
    t.global_step += 1
    step_schedulers(t, "step")


def _nonfinite(t: Trainer, loss: torch.Tensor, batch_idx: int) -> bool:
    """detect_nonfinite: True to skip this micro-batch's backward; raises under "raise". Costs a host sync
    (and, with several ranks, a 1-element all-reduce so that every rank skips the same step)."""
    bad = t.strategy.any_rank(not bool(torch.isfinite(loss.detach())))
    if bad and t.config.detect_nonfinite == "raise":
        raise TaskError(
            f"training loss is {loss.item()} at global step {t.global_step} (epoch {t.current_epoch}, batch "
            f"{batch_idx}) on rank {t.global_rank} or another rank; lower the learning rate, clip gradients, or "
            "pass detect_nonfinite='skip' to skip such batches."
        )
    return bad


def _stop_on_signal(t: Trainer) -> None:
    """SIGINT/SIGTERM reached a rank: every rank saves one checkpoint together, then exits 128+signal."""
    signum = t.stop_signal or signal.SIGTERM
    where = ""
    if t.config.enable_checkpointing:
        path = t._stop_checkpoint_path()
        t.save_checkpoint(path)
        where = f"; checkpoint saved to {path}"
    if t.is_global_zero:
        print(
            f"[tandem] stopping at global step {t.global_step} after {signal.Signals(signum).name}{where}",
            file=sys.stderr,
            flush=True,
        )
    raise SystemExit(128 + int(signum))


def _epoch_iterator(t: Trainer) -> tuple[Any, int]:
    """Iterator over this epoch's batches and the index of its first batch (non-zero when resuming).

    Resuming mid-epoch replays the epoch's random draws from the RNG state saved at its start, then skips
    the consumed batches in the batch sampler (indices only, no data is read), then restores the RNG
    state of the moment the checkpoint was taken; the rest of the epoch is identical to an uninterrupted run.
    """
    loader, skip = t.train_dataloader, t.batch_in_epoch
    if not (skip and t._resume_rng is not None and t.epoch_start_rng is not None):
        t.epoch_start_rng = get_rng_state()
        return iter(loader), 0
    set_rng_state(t.epoch_start_rng)
    if rebuildable(loader) and loader.batch_sampler is not None:
        sampler = SkipBatchSampler(loader.batch_sampler, skip)
        it = iter(rebuild(loader, batch_sampler=sampler))
        sampler.prime()
    else:  # iterable data sets cannot skip by index: read and drop the consumed batches
        it = iter(loader)
        for _ in islice(it, skip):
            pass
    set_rng_state(t._resume_rng)
    t._resume_rng = None
    return it, skip


def _remaining(n: int | float, start: int) -> int | None:
    """How many more batches to take from an iterator positioned at batch `start` (None: all of them)."""
    return None if n == float("inf") else max(int(n) - start, 0)


def _loss_of(out: Any) -> torch.Tensor:
    loss = out.get("loss") if isinstance(out, dict) else out
    if not isinstance(loss, torch.Tensor):
        raise TaskError(
            f"training_step returned {type(out).__name__}; return the loss tensor or a dict with key 'loss' "
            "(or set self.automatic_optimization = False and step the optimizer yourself)."
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
    return bool(t.val_dataloaders) and (every is None or (t.current_epoch + 1) % every == 0)


def run_eval(t: Trainer, stage: str, limit: int | None = None) -> list[dict[str, float]]:
    """One pass over the evaluation loaders of `stage` ('val', 'test' or 'predict') without gradients."""
    task, strategy = t.task, t.strategy
    assert task is not None
    loaders = t.val_dataloaders if stage == "val" else t.eval_dataloaders
    sizes = t.num_val_batches if stage == "val" else t.eval_num_batches
    hook_stage = {"val": "validation"}.get(stage, stage)
    step_name = f"{hook_stage}_step"
    was_training = task.training
    task.eval()
    t._metrics.reset(stage)
    t._call(f"on_{hook_stage}_start")
    t._call(f"on_{hook_stage}_epoch_start")
    predictions: list[list[Any]] = []
    results: list[dict[str, float]] = []
    with torch.no_grad():
        for dl_idx, (loader, n) in enumerate(zip(loaders, sizes)):
            multi = len(loaders) > 1
            t._metrics.dataloader_suffix = f"/dataloader_idx_{dl_idx}" if multi else ""
            extra = (dl_idx,) if multi else ()
            outputs: list[Any] = []
            n = n if limit is None else min(n, limit)
            if n == 0:
                continue
            for batch_idx, batch in enumerate(islice(loader, _remaining(n, 0))):
                batch = strategy.batch_to_device(batch)
                t._metrics.set_batch(batch)
                t._call(f"on_{hook_stage}_batch_start", batch, batch_idx, *extra)
                with strategy.precision.autocast():
                    out = strategy.eval_step(task, step_name, batch, batch_idx, dl_idx if multi else None)
                if stage == "predict":
                    outputs.append(out)
                t._call(f"on_{hook_stage}_batch_end", out, batch, batch_idx, *extra)
            predictions.append(outputs)
    t._metrics.dataloader_suffix = ""
    t._metrics.in_epoch_hook = True
    t._call(f"on_{hook_stage}_epoch_end")
    logged = t._metrics.epoch_end()
    t._metrics.in_epoch_hook = False
    if not t.sanity_checking:
        t._log(logged)
        results = _per_loader({k: float(v) for k, v in logged.items()}, len(loaders))
    t._call(f"on_{hook_stage}_end")
    task.train(was_training)
    t._metrics.switch("train")
    if stage == "predict":
        return predictions[0] if len(predictions) == 1 else predictions  # type: ignore[return-value]
    return results


def _per_loader(values: dict[str, float], n_loaders: int) -> list[dict[str, float]]:
    """One dict per loader (Lightning's result shape): its own '/dataloader_idx_i' metrics plus the shared ones."""
    if n_loaders <= 1:
        return [values]
    owner = {k: re.search(r"/dataloader_idx_(\d+)", k) for k in values}
    return [
        {k: v for k, v in values.items() if owner[k] is None or int(owner[k].group(1)) == i}  # type: ignore[union-attr]
        for i in range(n_loaders)
    ]


def evaluate(trainer: Trainer, stage: str) -> Any:
    """validate(), test() or predict(): one pass over that stage's loaders."""
    short = {"validate": "val"}.get(stage, stage)
    if short == "val":
        trainer.eval_dataloaders, trainer.eval_num_batches = trainer.val_dataloaders, trainer.num_val_batches
    out = run_eval(trainer, short)
    if stage != "predict":
        trainer._finalize_loggers("success")
    return out
