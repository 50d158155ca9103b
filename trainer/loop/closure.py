"""Automatic optimization as Lightning runs it: one batch's forward, zero_grad and backward live in a closure
that the optimizer step calls (``optimizer_step(epoch, batch_idx, optimizer, closure)`` and
``optimizer.step(closure)``), so optimizers that evaluate the closure several times (LBFGS, SAM-style) work
unchanged. Inside an accumulation window the loop calls the closure itself and takes no step."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from trainer.errors import TaskError

if TYPE_CHECKING:
    from trainer.trainer import Trainer

_grad_enabled, _set_grad_enabled = torch.is_grad_enabled, torch._C._set_grad_enabled  # cheaper than a context


class Closure:
    """The training step of one batch; `prepare` sets the batch, calling it runs the step and returns the
    detached loss (None when training_step skipped the batch). One instance serves a whole epoch."""

    def __init__(self, t: Trainer) -> None:
        self.t, self.task, self.strategy, self.hooks = t, t.task, t.strategy, t.hooks
        self.run_backward = t.task.backward if "backward" in t.hooks.custom else None  # type: ignore[union-attr]
        self.nonfinite = t.config.detect_nonfinite != "off"
        self.out: Any = None
        self.loss: torch.Tensor | None = None

    def prepare(
        self, batch: Any, batch_idx: int, window: int, zero: bool, sync: bool, rescale: float
    ) -> None:
        """This batch; its loss is divided by `window` (the micro-batches in its accumulation window), the
        gradients are zeroed first when `zero` (a window starts), synchronized when `sync` (it ends), and
        multiplied by `rescale` afterwards (a window an unknown-length epoch cut short)."""
        self.batch, self.batch_idx, self.window, self.zero, self.sync, self.rescale = (
            batch, batch_idx, window, zero, sync, rescale,
        )  # fmt: skip

    def __call__(self) -> torch.Tensor | None:
        if _grad_enabled():  # torch's optimizers call closures with gradients on; another may not
            return self._run()
        _set_grad_enabled(True)
        try:
            return self._run()
        finally:
            _set_grad_enabled(False)

    def _run(self) -> torch.Tensor | None:
        t, strategy, hooks = self.t, self.strategy, self.hooks
        with strategy.autocast(), t.profile("training_step"):
            out = strategy.step(self.task, "training_step", self.batch, self.batch_idx)
        loss = loss_of(out, t.world_size)  # None: the task skips this batch
        if loss is not None and self.window > 1:
            loss = loss / self.window  # k micro-batches of b equal one batch of k*b
        self.out, self.loss = out, loss
        if self.zero:  # a window starts: Lightning's moment to zero the gradients
            zero_grad(t, t.optimizers[0], self.batch_idx)
        if loss is not None and not (self.nonfinite and _nonfinite(t, loss, self.batch_idx)):
            hooks.call("on_before_backward", loss)
            with t.profile("backward"):
                strategy.backward(loss, sync=self.sync, run=self.run_backward)
            hooks.call("on_after_backward")
            if self.rescale != 1.0:
                _scale_grads(t.optimizers[0], self.rescale)
        return None if loss is None else loss.detach()

    def outputs(self) -> dict[str, Any]:
        """What on_train_batch_end receives, as Lightning: {"loss": the detached (divided) loss, other keys}."""
        out, loss = self.out, self.loss
        if loss is None:
            return {}
        extra = {k: v for k, v in out.items() if k != "loss"} if isinstance(out, dict) else {}
        return {"loss": loss.detach(), **extra}


def zero_grad(t: Trainer, optimizer: torch.optim.Optimizer, batch_idx: int) -> None:
    """on_before_zero_grad, then the task's optimizer_zero_grad (default: optimizer.zero_grad())."""
    t.hooks.call("on_before_zero_grad", optimizer)
    if "optimizer_zero_grad" in t.hooks.custom:
        t.task.optimizer_zero_grad(t.state.epoch, batch_idx, optimizer)  # type: ignore[union-attr]
    else:
        optimizer.zero_grad(set_to_none=True)


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
