"""Callbacks: hooks with (trainer, task, ...) signatures."""

from callbacks.base import Callback

__all__ = ["Callback"]
