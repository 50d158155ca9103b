"""LambdaCallback: a callback made from functions, one per hook."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from callbacks.base import Callback

#: the hooks LambdaCallback takes (Lightning's list)
HOOKS = (
    "setup", "teardown", "on_fit_start", "on_fit_end", "on_sanity_check_start", "on_sanity_check_end",
    "on_train_batch_start", "on_train_batch_end", "on_train_epoch_start", "on_train_epoch_end",
    "on_validation_epoch_start", "on_validation_epoch_end", "on_test_epoch_start", "on_test_epoch_end",
    "on_validation_batch_start", "on_validation_batch_end", "on_test_batch_start", "on_test_batch_end",
    "on_train_start", "on_train_end", "on_validation_start", "on_validation_end", "on_test_start", "on_test_end",
    "on_exception", "on_save_checkpoint", "on_load_checkpoint", "on_before_backward", "on_after_backward",
    "on_before_optimizer_step", "on_before_zero_grad", "on_predict_start", "on_predict_end",
    "on_predict_batch_start", "on_predict_batch_end", "on_predict_epoch_start", "on_predict_epoch_end",
)  # fmt: skip


def _method(fn: Callable[..., Any]) -> Callable[..., Any]:
    def hook(self: Any, *args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    return hook


class LambdaCallback(Callback):
    """Each keyword is a hook and its function, called with the hook's arguments ``(trainer, task, ...)``.

    Example: ``LambdaCallback(on_train_epoch_end=lambda trainer, task: print(trainer.current_epoch))``.
    """

    def __init__(self, **hooks: Callable[..., Any] | None) -> None:
        unknown = sorted(set(hooks) - set(HOOKS))
        if unknown:
            raise TypeError(f"LambdaCallback got unknown hook(s) {unknown}; it takes {list(HOOKS)}.")
        given = {name: fn for name, fn in hooks.items() if fn is not None}
        # the hook dispatcher calls what a callback's class overrides: give this one a class of its own
        self.__class__ = type(
            "LambdaCallback", (LambdaCallback,), {n: _method(fn) for n, fn in given.items()}
        )
        for name, fn in given.items():  # Lightning keeps them as attributes too
            self.__dict__[name] = fn

    def __reduce__(self) -> Any:  # a copy is made from the functions again
        return (_rebuild, ({n: v for n, v in vars(self).items() if n in HOOKS},))


def _rebuild(hooks: dict[str, Callable[..., Any]]) -> LambdaCallback:
    return LambdaCallback(**hooks)
