"""The dispatcher that calls the overridden hooks of a task and its callbacks in Lightning's order (the hooks
themselves are declared once, in tandem_core/hooks.py)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from tandem_core.hooks import DEFAULTS, HOOKS, TASK, overrides, refuse_unknown_hooks
from trainer.profiler import action_key


class Hooks:
    """Calls the overridden hooks of a task and its callbacks in Lightning's order: every callback in the
    Trainer's order (checkpointing last), then the task. A loop that
    needs Lightning's split (on_train_epoch_end) calls the plain callbacks and the task with
    ``monitoring=False``, then the monitoring callbacks (checkpointing, early stopping) with ``monitoring=True``.
    Example::

        hooks = Hooks(task, callbacks, trainer); hooks.call("on_train_epoch_start")
    """

    def __init__(self, task: Any, callbacks: list[Any], trainer: Any, profiler: Any = None) -> None:
        # per hook: (all in Lightning's order, the plain callbacks and the task, the monitoring callbacks)
        self._table: dict[str, tuple[list[Callable[..., Any]], ...]] = {}
        for obj in [task, *callbacks] if task is not None else callbacks:
            refuse_unknown_hooks(obj)
        for hook in HOOKS:
            cbs: list[tuple[bool, Callable[..., Any]]] = []
            for cb in callbacks:
                if overrides(cb, hook.name):
                    fn = functools.partial(getattr(cb, hook.name), trainer, task)
                    if profiler is not None:  # each hook timed under its owner's name
                        fn = profiler.wrap(action_key(cb, hook.name), fn)
                    cbs.append((bool(getattr(cb, "monitoring", False)), fn))
            own = [getattr(task, hook.name)] if TASK in hook.owners and overrides(task, hook.name) else []
            if profiler is not None and own:
                own = [profiler.wrap(action_key(task, hook.name), own[0])]
            if not cbs and not own:
                continue
            every = [fn for _, fn in cbs]
            plain = [fn for m, fn in cbs if not m] + own
            self._table[hook.name] = (every + own, plain, [fn for m, fn in cbs if m])
        # the task's own versions of Lightning's overridable methods (optimizer_step, backward, ...)
        self.custom = frozenset(n for n in DEFAULTS if task is not None and overrides(task, n))
        self._trainer = trainer
        self.transfer: dict[str, Any] = {}  # who runs each batch-transfer hook (loop/transfer.py), per stage

    def __contains__(self, name: str) -> bool:
        return name in self._table

    def caller(
        self, name: str, monitoring: bool | None = None, result: bool = False
    ) -> Callable[..., Any] | None:
        """Hook `name` as one callable that does what ``call(name, ...)`` does, or None when nobody overrides
        it: the loop looks its per-batch hooks up once per epoch and pays nothing at a step for the others.
        One override is returned as it is; several are called in order, returning the last non-None result
        when `result` is asked for (on_train_batch_start's -1), else None."""
        groups = self._table.get(name)
        fns = None if groups is None else groups[0 if monitoring is None else 2 if monitoring else 1]
        if not fns:
            return None
        if len(fns) == 1:
            return fns[0]
        return functools.partial(_call_all if result else _call_each, tuple(fns))

    def callers(self, name: str) -> tuple[Callable[..., Any], ...]:
        """Every override of hook `name` in calling order (empty when nobody overrides it): for a per-batch
        hook whose result nobody reads, which the loop calls in a loop of its own."""
        groups = self._table.get(name)
        return tuple(groups[0]) if groups is not None else ()

    def call(self, name: str, *args: Any, monitoring: bool | None = None, **kwargs: Any) -> Any:
        """Call every override of hook `name` (with `monitoring` given, only the plain callbacks and the task,
        or only the monitoring callbacks); return the last non-None result (the task's -1 from
        on_train_batch_start)."""
        groups = self._table.get(name)
        if groups is None:
            return None
        fns = groups[0 if monitoring is None else 2 if monitoring else 1]
        if getattr(self._trainer, "metric_store", None) is None:  # a dispatcher without a trainer
            return _call_all(fns, *args, **kwargs)
        return run_as(
            self._trainer, name, _call_all, fns, *args, **kwargs
        )  # with self.log's rules of the hook


def run_as(t: Any, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`fn(*args)`, a method of Lightning's that the loop calls directly (configure_optimizers, a batch-transfer
    hook, lr_scheduler_step, ...), with self.log's rules of `name` while it runs."""
    store = t.metric_store
    running, store.fx = store.fx, name
    try:
        return fn(*args, **kwargs)
    finally:
        store.fx = running


def _call_each(fns: tuple[Callable[..., Any], ...], *args: Any) -> None:
    """Call every function in order (a hook whose result nobody reads)."""
    for fn in fns:
        fn(*args)


def _call_all(fns: tuple[Callable[..., Any], ...], *args: Any, **kwargs: Any) -> Any:
    """Call every function in order; the last non-None result (as Hooks.call)."""
    out = None
    for fn in fns:
        result = fn(*args, **kwargs)
        if result is not None:
            out = result
    return out
