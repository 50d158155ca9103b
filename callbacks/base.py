"""Callback: hooks that receive (trainer, task, ...), as Lightning's receive (trainer, pl_module, ...)."""

from __future__ import annotations

from typing import Any

from tandem_core.hooks import CALLBACK, add_hook_stubs


class Callback:
    """Override the hooks you need; only overridden hooks are called, so the others cost nothing.

    Example::

        class PrintLoss(Callback):
            def on_train_epoch_end(self, trainer, task):
                print(trainer.callback_metrics["train/loss"])
    """

    #: Monitoring callbacks (checkpointing, early stopping) run after the task's own hook.
    monitoring = False

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
            from tandem_core.errors import ConfigError

            raise ConfigError(
                f"two callbacks save their state under the same key {cb.state_key!r}: {other!r} and {cb!r}; "
                "a checkpoint would hold only one state for both. Keep one of them, or give them different "
                "arguments (ModelCheckpoint: monitor, mode, every_n_*), or a subclass with its own state_key."
            )
