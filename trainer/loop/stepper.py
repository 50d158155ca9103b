"""The optimizer step of automatic optimization as the training loop calls it (the closure running inside it,
through the task's optimizer_step where it has one), and the training loader's None batches."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from strategies.base import is_plain
from trainer.loop.closure import NOT_RUN, Closure, not_run
from trainer.loop.optim import StepClosure, step_schedulers

if TYPE_CHECKING:
    from trainer.trainer import Trainer


def stepper(t: Trainer, closure: Closure) -> Callable[[int], None]:
    """`step(batch_idx)`: one optimizer step of automatic optimization, the closure (prepared for its batch)
    running inside it (through the task's optimizer_step if it has one), then the step-interval schedulers."""
    task, state = t.task, t.state
    assert task is not None
    if "optimizer_step" in t.hooks.custom:

        def step(batch_idx: int) -> None:
            closure.out = NOT_RUN
            task.optimizer_step(state.epoch, batch_idx, task._optimizers[0], closure)
            if closure.out is NOT_RUN:
                raise not_run(task, own_step=True)
            if t.lr_scheduler_configs:  # (the plateau ones after the batch's validation)
                step_schedulers(t, "step", plateau=False)

        return step
    optimizer_step = _optimizer_step(t, closure)

    def step(batch_idx: int) -> None:
        closure.out = NOT_RUN
        optimizer_step()
        if closure.out is NOT_RUN:  # the optimizer's step() never called its closure: no training step ran
            raise not_run(task, own_step=False)
        state.global_step += 1
        if t.lr_scheduler_configs:
            step_schedulers(t, "step", plateau=False)

    return step


def batch_stepper(t: Trainer, closure: Closure) -> Callable[[Any, int, int, bool], None]:
    """`step(data, hook_idx, batch_idx, last)`: `stepper`'s step for a batch that is a window of its own (no
    accumulation), its batch given to the closure on the way: the training loop's step path in the common case."""
    task, state = t.task, t.state
    if "optimizer_step" in t.hooks.custom:
        run = stepper(t, closure)

        def own(data: Any, hook_idx: int, batch_idx: int, last: bool) -> None:
            closure.batch, closure.batch_idx = data, hook_idx
            run(hook_idx)

        return own
    optimizer_step, schedulers = _optimizer_step(t, closure), t.lr_scheduler_configs

    def step(data: Any, hook_idx: int, batch_idx: int, last: bool) -> None:
        closure.batch, closure.batch_idx, closure.out = data, hook_idx, NOT_RUN
        optimizer_step()
        if closure.out is NOT_RUN:  # the optimizer's step() never called its closure: no training step ran
            raise not_run(task, own_step=False)
        state.global_step += 1
        if schedulers:  # (the list the epoch started with: configure_optimizers ran before)
            step_schedulers(t, "step", plateau=False)

    return step


def _optimizer_step(t: Trainer, closure: Closure) -> Callable[[], Any]:
    """The optimizer step with the closure: the optimizer's own where the strategy adds nothing to it."""
    optimizer, strategy = closure.optimizer, t.strategy
    step_closure = StepClosure(t, optimizer, closure)
    if step_closure.only_calls_closure:  # (so the strategy is plain) the optimizer runs the closure itself
        return functools.partial(optimizer.step, closure)
    if is_plain(strategy):  # what the strategy's optimizer_step would do
        return functools.partial(optimizer.step, step_closure)
    return functools.partial(strategy.optimizer_step, optimizer, step_closure)


def none_batch(t: Trainer) -> None:
    """Say once per fit that the training loader gave None (the step is skipped, as in Lightning)."""
    session = t.session
    if not getattr(session, "warned_none_batch", False):
        session.warned_none_batch = True  # type: ignore[union-attr]
        warnings.warn(
            "train_dataloader yielded None: that batch's training step is skipped (no loss, no optimizer "
            "step); on_train_batch_end gets None as its outputs.",
            UserWarning,
            stacklevel=2,
        )


def eval_modules_message(task: Any) -> str:
    """What fit says when training starts with submodules in eval mode (a PossibleUserWarning, as Lightning)."""
    names = [name or type(task).__name__ for name, m in task.named_modules() if not m.training]
    shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
    return (
        f"{len(names)} module(s) are in eval mode as training starts ({shown}): dropout and batch norm behave "
        "as in evaluation there. Ignore this if it is intended (a frozen part), else call .train() on them."
    )
