"""Callback: hooks that receive (trainer, task, ...), as Lightning's receive (trainer, pl_module, ...)."""

from __future__ import annotations

from typing import Any

from trainer.loop.hooks import CALLBACK, add_hook_stubs


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
