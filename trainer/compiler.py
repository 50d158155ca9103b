"""torch.compile through the Trainer: ``Trainer(compile=True | {...})`` or ``fit(torch.compile(task))``.

As in Lightning, a compiled Task is unwrapped first: the strategy sets up (moves, wraps, shards) the plain
module, and compilation is applied afterwards, in place, to the task's forward and its ``*_step`` methods
(``nn.Module.compile``'s way: parameter names stay plain, so compiled and eager runs load each other's
checkpoints). At the end of the stage the task is given back uncompiled; torch's cache keeps the compiled
code, so the next stage does not compile again. Recompilations are counted where they cost nothing (at
each epoch's end and the stage's end) and a run that recompiles more than `RECOMPILE_WARN` times says why.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from tandem_core.errors import ConfigError
from trainer.utilities.compile import compile_methods, compiler_context, to_uncompiled

STEP_METHODS = ("training_step", "validation_step", "test_step", "predict_step")
# the Trainer's side of a step: run eagerly from compiled steps (dynamo would guard on the metric store's
# Python state and recompile every step, or trace a backward or an optimizer step into the graph)
EAGER_METHODS = (
    "log", "log_dict", "manual_backward", "optimizers", "lr_schedulers", "all_gather", "print",
    "toggle_optimizer", "untoggle_optimizer", "clip_gradients",
)  # fmt: skip
RECOMPILE_WARN = (
    3  # recompilations in one stage beyond which the run says why (torch's own limit is 8 per frame)
)
_COMPILE_KEYS = tuple(p for p in inspect.signature(torch.compile).parameters if p != "model")
# What Trainer(compile={...}) / a config's trainer.compile may set: typed values from fixed sets, nothing
# that reaches a compiler's command line, an environment variable or a path (torch.compile's `options`
# hold inductor's cpp.march, cuda.nvcc flags, cache dirs...: refused; compile in Python with
# fit(torch.compile(task, options=...)) to use them). A callable backend is a Python object, never config.
ALLOWED: dict[str, tuple[Any, ...]] = {
    "mode": (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"),
    "fullgraph": (True, False),
    "dynamic": (None, True, False),
    "backend": ("inductor", "eager", "aot_eager", "cudagraphs"),
    "disable": (True, False),
}


@dataclass
class Compiler:
    """How to compile: torch.compile's keyword arguments, or the context of a module the user compiled."""

    kwargs: dict[str, Any] = field(default_factory=dict)
    context: Any = None  # the dynamo context of a ``torch.compile(task)`` (its backend, mode and options)
    restore: Callable[[], Any] | None = None  # after the stage: the task as handed in (from_compiled's)

    def __call__(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        return self.context(fn) if self.context is not None else torch.compile(fn, **self.kwargs)

    @property
    def cudagraphs(self) -> bool:
        """Whether the compiled steps replay CUDA graphs (mode "reduce-overhead" or "max-autotune", backend
        "cudagraphs", or a ``torch.compile(task, ...)`` whose inductor settings turn them on). A replay writes
        its outputs into the memory of the previous one: the loop then marks each step's start and keeps
        copies of what it holds across steps (docs/concepts.md, "CUDA graphs")."""
        if self.context is not None:
            config = getattr(self.context, "compiler_config", None) or {}
            return bool(config.get("triton.cudagraphs"))
        kw = self.kwargs
        if kw.get("backend") == "cudagraphs":
            return True
        if kw.get("backend", "inductor") != "inductor" or kw.get("mode") in (None, "default"):
            return False
        from torch._inductor import list_mode_options

        return bool(list_mode_options(kw["mode"]).get("triton.cudagraphs"))


def from_option(value: Any) -> Compiler | None:
    """``Trainer(compile=...)``: False/None (off), True (torch.compile's defaults) or a dict of its keywords."""
    if value is None or value is False:
        return None
    if value is True:
        return Compiler()
    if isinstance(value, dict):
        for key, given in value.items():
            check_key(key, given)
        return Compiler(kwargs=dict(value))
    raise ConfigError(f"compile must be True, False or a dict of torch.compile keywords, got {value!r}.")


def check_key(key: Any, given: Any) -> None:
    """One entry of the compile dict: a key of ALLOWED with one of its values (a callable backend too)."""
    slot = f"trainer.compile.{key}"
    if key not in ALLOWED:
        known = "a keyword torch.compile does not take" if key not in _COMPILE_KEYS else "not allowed"
        raise ConfigError(
            f"{slot} is refused ({known}): Trainer(compile=...) takes only {sorted(ALLOWED)} "
            "(values from fixed sets, docs/configuration.md#trust); options that reach a compiler's command "
            "line, the environment or a path (torch.compile's `options`, ...) are never taken from a config. "
            "To use them, compile in Python: trainer.fit(torch.compile(task, options=...))."
        )
    if key == "backend" and callable(given) and not isinstance(given, str):
        return
    if not any(given is v or (type(given) is type(v) and given == v) for v in ALLOWED[key]):
        raise ConfigError(f"{slot}={given!r} is refused: it must be one of {list(ALLOWED[key])}.")


def unwrap_compiled(task: Any, option: Compiler | None) -> tuple[Any, Compiler | None]:
    """The plain module of a ``torch.compile(task)`` or a ``from_compiled(...)`` task and how it was compiled;
    other objects pass through. A from_compiled task is compiled again the same way at the stage's end."""
    compiled = isinstance(task, torch._dynamo.eval_frame.OptimizedModule)
    context = task.dynamo_ctx if compiled else compiler_context(task)
    if context is None:
        return task, option
    if option is not None:
        raise ConfigError(
            "the task was passed through torch.compile and Trainer(compile=...) is set too: compile in one "
            "place only (pass the plain task, or drop the Trainer option)."
        )
    if compiled:
        return task._orig_mod, Compiler(context=context)
    plain = to_uncompiled(task)
    return plain, Compiler(context=context, restore=functools.partial(compile_methods, plain, context))


def apply(task: torch.nn.Module, compiler: Compiler) -> Callable[[], None]:
    """Compile `task` in place: ``task(...)`` (forward with its hooks) and each step method it has (a
    strategy's wrapper of it too, e.g. FSDP's), with the Trainer's side of a step (self.log, ...) left eager;
    returns the function that gives the task back uncompiled."""
    saved = {name: task.__dict__.get(name, _ABSENT) for name in (*STEP_METHODS, *EAGER_METHODS)}
    wrappers = list(getattr(task, "_optimizers", []))  # what self.optimizers() hands a manual step
    task._compiled_call_impl = compiler(task._call_impl)  # what nn.Module.compile does
    for name in STEP_METHODS:  # instance attributes over the class's methods
        if getattr(type(task), name, None) is not None:
            method = getattr(task, name)
            compiled = compiler(method)
            # the signature the loop reads to pass batch_idx (strategies.base.call_step), as uncompiled
            compiled.__signature__ = inspect.signature(getattr(method, "__func__", method))
            setattr(task, name, compiled)
    for name in EAGER_METHODS:
        if getattr(type(task), name, None) is not None:
            setattr(task, name, torch.compiler.disable(getattr(task, name)))
    for opt in wrappers:  # opt.step() and opt.zero_grad() from a compiled manual training_step run eagerly
        for name in ("step", "zero_grad"):
            setattr(opt, name, torch.compiler.disable(getattr(opt, name)))

    def undo() -> None:
        task._compiled_call_impl = None
        for opt in wrappers:
            for name in ("step", "zero_grad"):
                opt.__dict__.pop(name, None)
        for name, old in saved.items():
            if old is _ABSENT:
                task.__dict__.pop(name, None)
            else:
                task.__dict__[name] = old
        if compiler.restore is not None:
            compiler.restore()

    return undo


_ABSENT = object()


def mark_step() -> None:
    """Tell torch's CUDA-graph trees that a new step begins (the loop calls it before each step's forward under
    CUDA graphs): the previous step's graph outputs may then be overwritten, and nothing the loop keeps past a
    step is one of them."""
    torch.compiler.cudagraph_mark_step_begin()


class RecompileWatch:
    """Counts dynamo's recompilations since the stage started; `check` warns, with torch's reasons, when
    there are more than RECOMPILE_WARN (each new reason said once).

    Torch records, per compiled code, one reason for each cached entry whose guards failed on a call: the
    n-th recompilation of a frame adds n - 1 reasons (every older entry failed). A cached entry that failed
    once was followed by a recompilation, so the recompilations are the entries that ever failed."""

    def __init__(self) -> None:
        self._start = _failed_entries()
        self._said: set[str] = set()
        self._warned = False

    def check(self, where: str) -> None:
        now = _failed_entries()
        new = {key: reason for key, reason in now.items() if key not in self._start}
        if len(new) <= RECOMPILE_WARN:
            return
        fresh = [r for r in dict.fromkeys(new.values()) if r not in self._said]
        if self._warned and not fresh:
            return
        self._said.update(fresh)
        self._warned = True
        shown = "; ".join(fresh[:5]) + (f"; and {len(fresh) - 5} more" if len(fresh) > 5 else "")
        warnings.warn(
            f"torch.compile recompiled {len(new)} times so far ({where}); each recompilation costs seconds and "
            f"after {torch._dynamo.config.recompile_limit} a function falls back to eager. torch's reasons: "
            f"{shown}. Typical causes: batches of changing shapes (pad them, or compile with dynamic=True), "
            "or a Python value used in the step that changes every call (pass it as a tensor).",
            UserWarning,
            stacklevel=2,
        )


def _failed_entries() -> dict[tuple[Any, str], str]:
    """(compiled code, "frame/entry") -> the guard that failed there, for every cached entry that failed."""
    from torch._dynamo.utils import guard_failures

    out: dict[tuple[Any, str], str] = {}
    for code, reasons in guard_failures.items():
        for reason in reasons:
            entry, _, text = str(reason).splitlines()[0].partition(": ")
            out.setdefault((code, entry), " ".join(text.split()))
    return out
