"""The optimizer step of automatic optimization as the training loop calls it (the closure running inside it,
through the task's optimizer_step where it has one), and the training loader's None batches."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from strategies.base import is_plain
from trainer.loop.closure import NOT_RUN, Closure, not_run
from trainer.loop.optim import StepClosure, step_schedulers

if TYPE_CHECKING:
    from trainer.trainer import Trainer


def stepper(t: Trainer, closure: Closure) -> Callable[[int], None]:
    """`step(batch_idx)`: one optimizer step of automatic optimization, the closure running inside it
    (through the task's optimizer_step if it has one), then the step-interval schedulers."""
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
    optimizer, strategy = closure.optimizer, t.strategy
    step_closure, plain = StepClosure(t, optimizer, closure), is_plain(strategy)
    if step_closure.only_calls_closure:  # (so the strategy is plain) the optimizer runs the closure itself
        step_closure = closure  # type: ignore[assignment]

    def step(batch_idx: int) -> None:
        closure.out = NOT_RUN
        if plain:  # what the strategy's optimizer_step would do
            optimizer.step(step_closure)
        else:
            strategy.optimizer_step(optimizer, step_closure)
        if closure.out is NOT_RUN:  # the optimizer's step() never called its closure: no training step ran
            raise not_run(task, own_step=False)
        state.global_step += 1
        if t.lr_scheduler_configs:
            step_schedulers(t, "step", plateau=False)

    return step


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
