"""TaskOptimizer: what ``self.optimizers()`` returns (Lightning's ``LightningOptimizer``): the optimizer, wrapped
so that ``step()`` goes through the strategy and precision and counts the step."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch

from tandem_core.errors import TaskError
from trainer.loop.optim import optimizer_step

if TYPE_CHECKING:
    from trainer.trainer import Trainer


class TaskOptimizer:
    """Wraps `optimizer` (Lightning's ``LightningOptimizer(optimizer)``). An instance is also an instance of the
    optimizer's class (``isinstance(opt, torch.optim.Adam)`` holds, as in Lightning); its ``state``,
    ``param_groups``, ``defaults``, ``state_dict()`` and ``load_state_dict()`` are the wrapped optimizer's own.
    Under a Trainer, ``step()`` goes through the strategy (the closure, if any, runs inside it first) and counts
    the step. Example: ``opt = self.optimizers(); opt.zero_grad(); self.manual_backward(loss); opt.step()``."""

    def __init__(self, optimizer: torch.optim.Optimizer, trainer: Trainer | None = None) -> None:
        if isinstance(optimizer, TaskOptimizer):
            optimizer = optimizer.optimizer
        self._optimizer = optimizer
        self._trainer = trainer
        if isinstance(optimizer, torch.optim.Optimizer):
            self.__class__ = _imitating(type(optimizer))

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The wrapped optimizer."""
        return self._optimizer

    # the wrapped optimizer's state, read and written through (never a stale copy on the wrapper)
    state = property(
        lambda self: self._optimizer.state,
        lambda self, v: setattr(self._optimizer, "state", v),
        doc="The wrapped optimizer's per-parameter state.",
    )
    param_groups = property(
        lambda self: self._optimizer.param_groups,
        lambda self, v: setattr(self._optimizer, "param_groups", v),
        doc="The wrapped optimizer's parameter groups.",
    )
    defaults = property(
        lambda self: self._optimizer.defaults,
        lambda self, v: setattr(self._optimizer, "defaults", v),
        doc="The wrapped optimizer's default hyperparameters.",
    )

    def state_dict(self) -> dict[str, Any]:
        """The wrapped optimizer's state_dict."""
        return self._optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load into the wrapped optimizer."""
        self._optimizer.load_state_dict(state_dict)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a parameter group to the wrapped optimizer."""
        self._optimizer.add_param_group(param_group)

    def step(self, closure: Callable[[], Any] | None = None, **kwargs: Any) -> Any:
        """Step through the strategy (the closure, if any, runs inside it first) and count the step; `kwargs`
        go to the optimizer's own ``step`` (Lightning's ``opt.step(closure=..., **kwargs)``)."""
        if self._trainer is None:
            raise TaskError(
                "this optimizer wrapper belongs to no Trainer: step the optimizer itself (wrapper.optimizer.step()), "
                "or use the one self.optimizers() returns during fit."
            )
        if closure is not None and not callable(closure):
            raise TaskError(
                f"optimizer.step(closure=...) needs a callable closure, not {type(closure).__name__}"
            )
        out = optimizer_step(self._trainer, self._optimizer, closure, **kwargs)
        self._trainer.state.global_step += 1
        return out

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The wrapped optimizer's zero_grad."""
        self._optimizer.zero_grad(set_to_none=set_to_none)

    @contextlib.contextmanager
    def toggle_model(self, sync_grad: bool = True) -> Iterator[None]:
        """Inside: only this optimizer's parameters require gradients (the task's ``toggle_optimizer``), and with
        ``sync_grad=False`` ``manual_backward`` accumulates locally without reducing gradients across processes
        (an accumulation step); as Lightning's ``LightningOptimizer.toggle_model``."""
        if self._trainer is None or self._trainer.task is None:
            raise TaskError("toggle_model() needs the optimizer of a running Trainer (self.optimizers()).")
        task = self._trainer.task
        object.__setattr__(task, "_manual_sync", sync_grad)  # read by Task.manual_backward
        task.toggle_optimizer(self)
        try:
            yield
        finally:
            task.untoggle_optimizer(self)
            object.__setattr__(task, "_manual_sync", True)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "_optimizer":  # unpickling asks before _optimizer exists
            raise AttributeError(name)
        return getattr(self._optimizer, name)

    def __reduce__(self) -> Any:
        """Pickled as the wrapped optimizer and its Trainer (the imitating class is made again on load)."""
        return (TaskOptimizer, (self._optimizer, self._trainer))

    def __repr__(self) -> str:
        """The wrapped optimizer's, prefixed ``Task`` (Lightning's wrapper prints ``Lightning`` + it)."""
        return f"Task{self._optimizer!r}"


@functools.cache
def _imitating(cls: type) -> type:
    """TaskOptimizer that is also a `cls` (one class per optimizer class), as Lightning's wrapper imitates the
    wrapped optimizer's class so that isinstance checks hold."""
    return type(f"Task{cls.__name__}", (TaskOptimizer, cls), {"__module__": __name__})
