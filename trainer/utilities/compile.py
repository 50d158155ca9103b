"""Lightning's ``from_compiled`` / ``to_uncompiled`` (``lightning.pytorch.utilities.compile``) on Tandem's Task.

``torch.compile(task)`` returns a wrapper (``OptimizedModule``) that is no ``Task``. ``from_compiled`` gives back
the Task itself with its ``forward`` and ``*_step`` methods compiled the way the wrapper compiles (its dynamo
context: backend, mode, options), so that ``isinstance(..., Task)`` holds and the steps run compiled when called
directly (inference, a custom loop). ``to_uncompiled`` gives the plain methods back. ``trainer.fit`` takes either
form: it sets up the plain module and compiles it afterwards (trainer/compiler.py), and gives a task made by
``from_compiled`` back compiled as it was handed in.

    task = from_compiled(torch.compile(MyTask(), backend="inductor"))
    task.predict_step(batch)            # compiled
    task = to_uncompiled(task)          # plain again
"""

from __future__ import annotations

from typing import Any

import torch

from trainer.task.base import Task

#: the methods ``from_compiled`` compiles (Lightning's set)
COMPILED_METHODS = ("forward", "training_step", "validation_step", "test_step", "predict_step")
_ABSENT = object()


def _is_compiled_module(model: Any) -> bool:
    return isinstance(model, torch._dynamo.eval_frame.OptimizedModule)


def compile_methods(task: Task, dynamo_ctx: Any) -> Task:
    """Compile `task`'s forward and step methods in place with `dynamo_ctx` (what from_compiled does)."""
    saved = {name: task.__dict__.get(name, _ABSENT) for name in COMPILED_METHODS}
    for name in COMPILED_METHODS:
        setattr(task, name, dynamo_ctx(getattr(task, name)))
    # Lightning's attribute for a compiled module: which compiler, its context (here also what to restore)
    task._compiler_ctx = {"compiler": "dynamo", "dynamo_ctx": dynamo_ctx, "saved": saved}
    return task


def from_compiled(model: Any) -> Task:
    """The Task wrapped by ``torch.compile(task)``, its forward and step methods compiled in place the same way."""
    if not _is_compiled_module(model):
        raise ValueError(
            f"from_compiled needs what torch.compile(task) returns (an OptimizedModule), got {type(model).__name__}"
        )
    task = model._orig_mod
    if not isinstance(task, Task):
        raise ValueError(f"from_compiled needs a compiled trainer.Task, got a compiled {type(task).__name__}")
    if compiler_context(task) is not None:  # compiled before: start from the plain methods
        to_uncompiled(task)
    return compile_methods(task, model.dynamo_ctx)


def compiler_context(task: Any) -> Any:
    """The dynamo context a task was compiled with by ``from_compiled``, else None."""
    ctx = getattr(task, "_compiler_ctx", None)
    return ctx["dynamo_ctx"] if ctx else None


def to_uncompiled(model: Any) -> Task:
    """The plain Task of ``torch.compile(task)`` or of ``from_compiled(...)``, its own methods given back in place."""
    if _is_compiled_module(model):
        task = model._orig_mod
        if not isinstance(task, Task):
            raise TypeError(f"the compiled module wraps a {type(task).__name__}, not a trainer.Task")
    elif isinstance(model, Task):
        if compiler_context(model) is None:
            raise ValueError(
                "`model` is required to be a compiled Task (from_compiled's or torch.compile's); this one is not "
                "compiled, so there is nothing to undo."
            )
        task = model
    else:
        raise ValueError(f"to_uncompiled takes a Task or torch.compile's module, got {type(model).__name__}")
    ctx = getattr(task, "_compiler_ctx", None)
    if ctx:
        for name, old in ctx["saved"].items():
            if old is _ABSENT:
                task.__dict__.pop(name, None)
            else:
                task.__dict__[name] = old
    task._compiler_ctx = None
    return task
