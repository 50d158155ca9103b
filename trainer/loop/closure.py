"""Automatic optimization as Lightning runs it: one batch's forward, zero_grad and backward live in a closure
that the optimizer step calls (``optimizer_step(epoch, batch_idx, optimizer, closure)`` and
``optimizer.step(closure)``), so optimizers that evaluate the closure several times (LBFGS, SAM-style) work
unchanged. Inside an accumulation window the loop calls the closure itself and takes no step."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch

from strategies.base import is_plain, step_runner
from tandem_core.errors import TaskError
from trainer.compiler import mark_step

if TYPE_CHECKING:
    from trainer.trainer import Trainer

_grad_enabled, _set_grad_enabled = torch.is_grad_enabled, torch._C._set_grad_enabled  # cheaper than a context
_Tensor = torch.Tensor


class SkippedStepError(TaskError, RuntimeError):
    """training_step returned None (skip the batch) under several processes (Lightning raises RuntimeError)."""


NOT_RUN = object()  # Closure.out before the closure runs in an optimizer step


def not_run(task: Any, own_step: bool) -> TaskError:
    """The error for an optimizer step whose closure never ran (Lightning raises one too): nothing trained."""
    where = (
        f"{type(task).__name__}.optimizer_step did not call `optimizer_closure()` (pass it on: "
        "optimizer.step(closure=optimizer_closure))"
        if own_step
        else "the optimizer's step() did not call the closure it was given (it must call `closure()`, as "
        "torch's optimizers do)"
    )
    return TaskError(f"The training step never ran: {where}.")


class Closure:
    """The training step of one batch; `prepare` sets the batch, calling it runs the step and returns the
    detached loss (None when training_step skipped the batch). One instance serves a whole epoch: what a
    step needs (the hooks that are overridden, the task's own methods, the optimizer) is looked up once."""

    def __init__(self, t: Trainer) -> None:
        hooks, task = t.hooks, t.task
        assert task is not None
        self.t, self.task, self.strategy = t, task, t.strategy
        self.optimizer = t.optimizers[0]
        self.run_backward = task.backward if "backward" in hooks.custom else None
        self.own_zero_grad = "optimizer_zero_grad" in hooks.custom
        self.before_zero_grad = hooks.caller("on_before_zero_grad")
        self.before_backward = hooks.caller("on_before_backward")
        self.after_backward = hooks.caller("on_after_backward")
        self.profiled = t.profiler is not None  # else no section is timed (not even entered)
        # CUDA graphs: each step marks its start, and the loss kept past the step is a copy (a replay
        # overwrites its outputs)
        self.cudagraphs = bool(getattr(t.session, "cudagraphs", False))
        # training_step under autocast (its signature read once), timed when profiled, its start marked under
        # CUDA graphs: all chosen here, so a step pays for none of the checks
        self.run_step = step_entry(t, step_runner(t.strategy, task, "training_step"), "training_step")
        self.zero_grad = functools.partial(self.optimizer.zero_grad, set_to_none=True)
        self.plain_backward = self.run_backward is None and is_plain(t.strategy)  # just loss.backward()
        self.world_size = t.world_size
        self.nonfinite = t.config.detect_nonfinite != "off"
        self.out: Any = None
        self.detached: torch.Tensor | None = None
        self.batch: Any = None
        self.batch_idx = 0
        self.window, self.zero, self.sync, self.rescale = 1, True, True, 1.0  # no accumulation (see prepare)
        # nothing between training_step and backward but zero_grad and detach: no hook overridden around
        # them, no profiler, no non-finite check, plain backward, no accumulation window (see prepare)
        self.bare = self.plain_backward and not (
            self.before_zero_grad or self.own_zero_grad or self.before_backward or self.after_backward
            or self.profiled or self.nonfinite or self.cudagraphs
        )  # fmt: skip
        self.lean = self.bare

    def prepare(
        self, batch: Any, batch_idx: int, window: int, zero: bool, sync: bool, rescale: float
    ) -> None:
        """This batch; its loss is divided by `window` (the micro-batches in its accumulation window), the
        gradients are zeroed first when `zero` (a window starts), synchronized when `sync` (it ends), and
        multiplied by `rescale` afterwards (a window an unknown-length epoch cut short)."""
        self.batch, self.batch_idx, self.window, self.zero, self.sync, self.rescale = (
            batch, batch_idx, window, zero, sync, rescale,
        )  # fmt: skip
        self.lean = self.bare and window == 1 and zero and sync and rescale == 1.0

    def __call__(self) -> torch.Tensor | None:
        if not _grad_enabled():  # torch's optimizers call closures with gradients on; another may not
            return self._with_grad()
        out = self.run_step(self.batch, self.batch_idx)
        if type(out) is _Tensor and out.ndim == 0 and out.requires_grad:  # the common case, checked inline
            if self.lean:  # what the rest of this method does when nothing else is asked for
                self.out = out
                self.zero_grad()
                self.detached = detached = out.detach()
                out.backward()
                return detached
            loss = out
        else:
            loss = loss_of(out, self.world_size)  # None: the task skips this batch
        return self._after_step(out, loss)

    def _after_step(self, out: Any, loss: torch.Tensor | None) -> torch.Tensor | None:
        """The rest of the closure once training_step returned `out` (its loss `loss`, None to skip)."""
        strategy = self.strategy
        if loss is not None and self.window > 1:
            loss = loss / self.window  # k micro-batches of b equal one batch of k*b
        self.out = out
        if self.zero:  # a window starts: Lightning's moment to zero the gradients
            if self.before_zero_grad is not None:
                self.before_zero_grad(self.optimizer)
            if self.own_zero_grad:
                self.task.optimizer_zero_grad(self.t.state.epoch, self.batch_idx, self.optimizer)
            else:
                self.optimizer.zero_grad(set_to_none=True)
        if loss is None:
            self.detached = None
            return None
        # what the optimizer and on_train_batch_end get (one detach per step; a copy under CUDA graphs)
        self.detached = loss.detach().clone() if self.cudagraphs else loss.detach()
        if self.nonfinite and _nonfinite(self.t, loss, self.batch_idx):
            return self.detached
        if self.before_backward is not None:
            self.before_backward(loss)
        if self.profiled:
            with self.t.profile("backward"):
                strategy.backward(loss, sync=self.sync, run=self.run_backward)
        elif self.plain_backward:
            loss.backward()
        else:
            strategy.backward(loss, sync=self.sync, run=self.run_backward)
        if self.after_backward is not None:
            self.after_backward()
        if self.rescale != 1.0:
            _scale_grads(self.optimizer, self.rescale)
        return self.detached

    def _with_grad(self) -> torch.Tensor | None:
        _set_grad_enabled(True)
        try:
            return self()
        finally:
            _set_grad_enabled(False)

    def outputs(self) -> dict[str, Any]:
        """What on_train_batch_end receives, as Lightning: {"loss": the detached (divided) loss, other keys}."""
        out, loss = self.out, self.detached
        if loss is None:
            return {}
        if not isinstance(out, dict):
            return {"loss": loss}
        return {"loss": loss, **{k: v for k, v in out.items() if k != "loss"}}


def step_entry(t: Trainer, run: Callable[..., Any], name: str) -> Callable[..., Any]:
    """`run` (a step method's call) timed under `name` when the profiler is on, and under CUDA graphs preceded
    by torch's mark that a new step begins (trainer/compiler.py, `mark_step`)."""
    profiled, marked = t.profiler is not None, bool(getattr(t.session, "cudagraphs", False))
    if not profiled and not marked:
        return run

    def entry(*args: Any) -> Any:
        if marked:
            mark_step()
        if not profiled:
            return run(*args)
        with t.profile(name):
            return run(*args)

    return entry


def manual_outputs(out: Any, copy: bool = False) -> dict[str, Any]:
    """What on_train_batch_end receives under manual optimization, as Lightning: always a dict; a returned tensor
    is its "loss"; "loss" detached (it was already backpropagated by the task), the other keys as returned;
    with `copy` (CUDA graphs) the loss is a copy that outlives the next replay."""
    if out is None:
        return {}
    if isinstance(out, torch.Tensor):
        return {"loss": out.detach().clone() if copy else out.detach()}
    if isinstance(out, Mapping):
        return {
            k: (v.detach().clone() if copy else v.detach())
            if k == "loss" and isinstance(v, torch.Tensor)
            else v
            for k, v in out.items()
        }
    raise TaskError(  # as Lightning: anything else is refused
        f"training_step returned {type(out).__name__} under manual optimization; return a tensor, a dict or None."
    )


def _scale_grads(optimizer: torch.optim.Optimizer, factor: float) -> None:
    with torch.no_grad():
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.grad.mul_(factor)


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


def loss_of(out: Any, world_size: int) -> torch.Tensor | None:
    """The loss in training_step's output; None (Lightning's "skip this batch") only on one process."""
    if out is None:
        if world_size > 1:
            raise SkippedStepError(
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
    if loss.numel() != 1:  # one element of any shape, e.g. (1, 1), trains as its scalar (as in Lightning)
        raise TaskError(
            f"training_step returned a loss of shape {tuple(loss.shape)}; reduce it to a scalar (e.g. .mean())."
        )
    if not loss.requires_grad:
        raise TaskError(
            "training_step returned a loss that does not require grad; compute it from the model's output."
        )
    return loss
