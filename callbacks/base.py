"""Callback: hooks that receive (trainer, task, ...), as Lightning's receive (trainer, pl_module, ...)."""

from __future__ import annotations

import functools
import inspect
from typing import Any

from tandem_core.errors import ConfigError
from tandem_core.hooks import CALLBACK, HOOKS, add_hook_stubs

# the hooks called a few times per stage or epoch (not per step), which users call themselves, by keyword, in their
# own tests (`timer.on_train_start(trainer=..., pl_module=...)`)
_PER_STEP = ("on_before_backward", "on_after_backward", "on_before_optimizer_step", "on_before_zero_grad")
_STAGE_HOOKS = tuple(
    h.name for h in HOOKS if CALLBACK in h.owners and "batch" not in h.name and h.name not in _PER_STEP
)


def _takes_pl_module(fn: Any) -> Any:
    """`fn` (a callback's stage or epoch hook taking `task`) that also takes Lightning's keyword `pl_module=`."""

    @functools.wraps(fn)
    def hook(self: Any, *args: Any, **kwargs: Any) -> Any:
        if "pl_module" in kwargs:
            kwargs["task"] = kwargs.pop("pl_module")
        return fn(self, *args, **kwargs)

    return hook


class Callback:
    """Override the hooks you need; only overridden hooks are called, so the others cost nothing.

    Example::

        class PrintLoss(Callback):
            def on_train_epoch_end(self, trainer, task):
                print(trainer.callback_metrics["train/loss"])
    """

    #: Monitoring callbacks (checkpointing, early stopping) run after the task's own hook.
    monitoring = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A subclass's stage and epoch hooks written with Tandem's argument name `task` are also called as
        Lightning's ``cb.setup(trainer=..., pl_module=..., stage=...)`` (the per-step hooks are left as written: no
        cost in the step)."""
        super().__init_subclass__(**kwargs)
        for name in _STAGE_HOOKS:
            fn = cls.__dict__.get(name)
            if callable(fn) and "task" in inspect.signature(fn).parameters:
                setattr(cls, name, _takes_pl_module(fn))

    @property
    def state_key(self) -> str:
        """Key of this callback's state in a checkpoint."""
        return type(self).__qualname__

    def state_dict(self) -> dict[str, Any]:
        """State saved in checkpoints."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what state_dict returned."""


add_hook_stubs(Callback, CALLBACK)  # every hook as a documented no-op taking (trainer, task, ...)


class Checkpoint(Callback):
    """Base class of the callbacks that write checkpoints (ModelCheckpoint, OnExceptionCheckpoint)."""


def check_state_keys(callbacks: list[Callback]) -> None:
    """Refuse two stateful callbacks with the same state_key: their states would merge in a checkpoint and
    a resume would give one the other's state (Lightning refuses this too)."""
    seen: dict[str, Callback] = {}
    for cb in callbacks:
        if (
            getattr(type(cb), "state_dict", Callback.state_dict) is Callback.state_dict
        ):  # (a Mock(spec=...) too)
            continue  # keeps no state: nothing to mix up
        other = seen.setdefault(cb.state_key, cb)
        if other is not cb:
            raise DuplicateStateKeyError(
                f"two callbacks save their state under the same key {cb.state_key!r}: {other!r} and {cb!r}; "
                "a checkpoint would hold only one state for both. Keep one of them, or give them different "
                "arguments (ModelCheckpoint: monitor, mode, every_n_*), or a subclass with its own state_key."
            )


class DuplicateStateKeyError(ConfigError, RuntimeError):
    """Two stateful callbacks share a `state_key` (a RuntimeError too, as Lightning raises one there)."""
