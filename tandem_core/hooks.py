"""Every hook, declared once: names, arguments, owners and meaning (the bottom layer: Task, Callback and the
loop's dispatcher, trainer/loop/hooks.py, all read this one table).

`HOOKS` is the one list of hook names with their arguments and meaning. The no-op methods of `Task` and of
`Callback` are generated from it (`add_hook_stubs`), so the two never drift apart; Lightning's signatures:
a Task's hook takes the arguments, a Callback's takes ``(trainer, task, *arguments)``. At the start of each
stage the `Hooks` dispatcher collects only the methods that the task and each callback override, so a
step pays nothing for hooks nobody overrides.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from unittest import mock

from tandem_core.errors import TaskError

TASK, CALLBACK = "task", "callback"


@dataclass(frozen=True)
class Hook:
    """A hook's name, its arguments after (trainer, task) for callbacks, who may define it, and its meaning."""

    name: str
    args: tuple[str, ...]
    doc: str
    owners: tuple[str, ...] = (TASK, CALLBACK)


def _h(name: str, args: str, doc: str, owners: tuple[str, ...] = (TASK, CALLBACK)) -> Hook:
    return Hook(name, tuple(a for a in args.replace(" ", "").split(",") if a), doc, owners)


_BATCH = "batch, batch_idx, dataloader_idx=0"
_BATCH_END = "outputs, batch, batch_idx, dataloader_idx=0"

HOOKS: tuple[Hook, ...] = (
    _h("setup", "stage", "Called at the start of fit/validate/test/predict, on every rank."),
    _h("teardown", "stage", "Called at the end of fit/validate/test/predict, on every rank."),
    _h("on_fit_start", "", "Called once at the start of fit."),
    _h("on_fit_end", "", "Called once at the end of fit."),
    _h("on_sanity_check_start", "", "Called before the sanity validation steps.", (CALLBACK,)),
    _h("on_sanity_check_end", "", "Called after the sanity validation steps.", (CALLBACK,)),
    _h("on_train_start", "", "Called before the first training epoch."),
    _h("on_train_end", "", "Called after the last training epoch."),
    _h("on_train_epoch_start", "", "Called at the start of every training epoch."),
    _h("on_train_epoch_end", "", "Called at the end of every training epoch."),
    _h(
        "on_train_batch_start",
        "batch, batch_idx",
        "Called before training_step; returning -1 ends the epoch.",
    ),
    _h(
        "on_train_batch_end",
        "outputs, batch, batch_idx",
        "Called after a batch and its optimizer step, if any.",
    ),
    _h("on_validation_start", "", "Called before a validation run."),
    _h("on_validation_end", "", "Called after a validation run."),
    _h("on_validation_epoch_start", "", "Called at the start of a validation epoch."),
    _h("on_validation_epoch_end", "", "Called at the end of a validation epoch."),
    _h("on_validation_batch_start", _BATCH, "Called before validation_step."),
    _h("on_validation_batch_end", _BATCH_END, "Called after validation_step."),
    _h("on_test_start", "", "Called before testing."),
    _h("on_test_end", "", "Called after testing."),
    _h("on_test_epoch_start", "", "Called at the start of the test epoch."),
    _h("on_test_epoch_end", "", "Called at the end of the test epoch."),
    _h("on_test_batch_start", _BATCH, "Called before test_step."),
    _h("on_test_batch_end", _BATCH_END, "Called after test_step."),
    _h("on_predict_start", "", "Called before predicting."),
    _h("on_predict_end", "", "Called after predicting."),
    _h("on_predict_epoch_start", "", "Called at the start of the predict epoch."),
    _h("on_predict_epoch_end", "", "Called at the end of the predict epoch."),
    _h("on_predict_batch_start", _BATCH, "Called before predict_step."),
    _h("on_predict_batch_end", _BATCH_END, "Called after predict_step."),
    _h("on_before_backward", "loss", "Called before backward."),
    _h("on_after_backward", "", "Called after backward (under DDP the gradients are already averaged)."),
    _h(
        "on_before_optimizer_step",
        "optimizer",
        "Called with final, unscaled gradients, before clipping and the step.",
    ),
    _h("on_before_zero_grad", "optimizer", "Called before optimizer.zero_grad()."),
    _h("on_save_checkpoint", "checkpoint", "Add to the checkpoint dict before it is written."),
    _h("on_load_checkpoint", "checkpoint", "Read back what on_save_checkpoint added."),
    _h("on_exception", "exception", "Called when fit/validate/test/predict raises.", (CALLBACK,)),
)
HOOK_NAMES = frozenset(h.name for h in HOOKS)

#: Task methods with a default behaviour (trainer/task/defaults.py) that the loop calls only when overridden
DEFAULTS = (
    "prepare_data", "configure_model", "configure_callbacks", "on_before_batch_transfer", "transfer_batch_to_device",
    "on_after_batch_transfer", "backward", "optimizer_step", "optimizer_zero_grad", "configure_gradient_clipping",
    "lr_scheduler_step", "on_validation_model_eval", "on_validation_model_train", "on_validation_model_zero_grad",
    "on_test_model_eval", "on_test_model_train", "on_predict_model_eval",
)  # fmt: skip


def _params(names: tuple[str, ...]) -> list[inspect.Parameter]:
    out = []
    for a in names:
        name, _, default = a.partition("=")
        kw: dict[str, Any] = {"default": int(default)} if default else {}
        out.append(inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, **kw))
    return out


def default(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Mark a Task method as Lightning's default behaviour: the loop calls it only where a task overrides it."""
    fn._tandem_default = True  # type: ignore[attr-defined]
    return fn


def add_hook_stubs(cls: type, owner: str) -> type:
    """Give `cls` a documented no-op method for every hook `owner` ("task" or "callback") may define."""
    lead = ("self",) if owner == TASK else ("self", "trainer", "task")
    for hook in HOOKS:
        if owner not in hook.owners or hook.name in cls.__dict__:
            continue

        def stub(self: Any, *args: Any, **kwargs: Any) -> None:
            return None

        stub.__name__, stub.__qualname__ = hook.name, f"{cls.__qualname__}.{hook.name}"
        stub.__doc__ = hook.doc
        stub.__signature__ = inspect.Signature(_params(lead) + _params(hook.args))  # type: ignore[attr-defined]
        stub._tandem_default = True  # type: ignore[attr-defined]
        setattr(cls, hook.name, stub)
    return cls


def overrides(obj: Any, name: str) -> bool:
    """True if `obj`'s class defines hook or method `name` itself (not the no-op stub or Tandem's default), or
    the instance was given its own (`task.training_step = fn`); an instance's `None` (`task.validation_step =
    None`) switches it off, as Lightning's `is_overridden` reads it. A compiled copy of a default method set on
    the instance (Trainer(compile=True)) is still the default."""
    own = getattr(obj, "__dict__", {}).get(name, _UNSET)
    if own is None:
        return False
    if callable(own):  # Lightning calls what the instance holds, whatever it wraps
        if isinstance(own, mock.NonCallableMock):  # a Mock answers every attribute: it wraps nothing
            return True
        compiled = getattr(own, "_torchdynamo_orig_callable", None)
        return compiled is None or not getattr(_unwrapped(compiled), "_tandem_default", False)
    fn = getattr(type(obj), name, None)
    if fn is None and isinstance(
        obj, mock.NonCallableMock
    ):  # Mock(spec=Callback) in a user's tests: every hook
        fn = getattr(obj, name, None)
    return fn is not None and getattr(fn, "_tandem_default", False) is not True


_UNSET = object()


def replaces_default(obj: Any, name: str) -> bool:
    """Lightning's `is_overridden` test: `obj.name`, seen through a wrapper (``functools.wraps``, a partial, a
    ``Mock(wraps=...)``), is not the no-op stub or Tandem's default. Where Lightning decides between two owners
    by it (a DataModule's batch-transfer hook over the task's), a wrapped default does not count."""
    fn = getattr(obj, name, None)
    fn = getattr(fn, "__wrapped__", fn)
    if isinstance(fn, mock.Mock):
        fn = fn._mock_wraps
    elif isinstance(fn, functools.partial):
        fn = fn.func
    fn = getattr(fn, "__func__", fn)
    return fn is not None and not getattr(fn, "_tandem_default", False)


def _unwrapped(fn: Any) -> Any:
    """What torch.compile, torch.compiler.disable or functools.wraps wrapped (a bound method reads as its
    function's attributes)."""
    for _ in range(8):
        inner = getattr(fn, "_torchdynamo_orig_callable", None) or getattr(fn, "__wrapped__", None)
        if inner is None:
            return fn
        fn = inner
    return fn


#: Lightning 1.x names that Lightning 2 removed or renamed: defining one is a TaskError when a stage starts
REFUSED = {
    "configure_sharded_model": "Lightning 2.1 renamed it configure_model; rename the method",
    "training_epoch_end": "Lightning 2.0 removed it; collect outputs in training_step and use on_train_epoch_end",
    "validation_epoch_end": "Lightning 2.0 removed it; collect outputs in validation_step and use on_validation_epoch_end",
    "test_epoch_end": "Lightning 2.0 removed it; collect outputs in test_step and use on_test_epoch_end",
    "training_step_end": "Lightning 2.0 removed it; do that work at the end of training_step",
    "validation_step_end": "Lightning 2.0 removed it; do that work at the end of validation_step",
    "test_step_end": "Lightning 2.0 removed it; do that work at the end of test_step",
    "on_epoch_start": "Lightning 2.0 removed it; use on_train_epoch_start (or on_validation_epoch_start)",
    "on_epoch_end": "Lightning 2.0 removed it; use on_train_epoch_end (or on_validation_epoch_end)",
    "on_batch_start": "Lightning 2.0 removed it; use on_train_batch_start",
    "on_batch_end": "Lightning 2.0 removed it; use on_train_batch_end",
    "on_pretrain_routine_start": "Lightning 2.0 removed it; use on_fit_start",
    "on_pretrain_routine_end": "Lightning 2.0 removed it; use on_fit_start",
    "on_init_start": "Lightning 2.0 removed it; do that work in the callback's __init__",
    "on_init_end": "Lightning 2.0 removed it; do that work in the callback's __init__",
    "on_keyboard_interrupt": "Lightning 2.0 removed it; use on_exception and check for KeyboardInterrupt",
    "on_configure_sharded_model": "Lightning 2.0 removed it; use setup",
    "on_before_accelerator_backend_setup": "Lightning 2.0 removed it; use setup",
    "tbptt_split_batch": "Lightning 2.0 removed truncated backpropagation through time; split the sequence in training_step",
}


def refuse_unknown_hooks(obj: Any) -> None:
    """Raise TaskError when `obj` (a task or callback) defines a hook that Tandem would never call."""
    for name, advice in REFUSED.items():
        fn = getattr(type(obj), name, None)
        if callable(fn) and not getattr(fn, "_tandem_refusal", False):
            raise TaskError(
                f"{type(obj).__name__}.{name} is a Lightning hook that Tandem never calls ({advice}); "
                "Tandem refuses it rather than skip it silently."
            )
