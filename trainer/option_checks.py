"""The checks of trainer/options.py: each raises OptionError naming the option and what it must be."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

from tandem_core.errors import ConfigError, did_you_mean

Check = Callable[[str, Any], None]  # check(name, value) raises OptionError when the value is invalid
ACCELERATORS = ("auto", "cpu", "cuda", "gpu", "mps")
#: Lightning's accelerators that Tandem has not
REFUSED_ACCELERATORS = ("tpu", "xla", "hpu")


class OptionError(ConfigError):
    """A Trainer option is unknown or has an invalid value; `option` names it."""

    def __init__(self, option: str, message: str, suggestion: str = "", unknown: bool = False) -> None:
        super().__init__(message)
        self.option, self.suggestion, self.unknown = option, suggestion, unknown

    @property
    def problem(self) -> str:
        """The message without the option's name in front ("must be ...", "unknown strategy ...")."""
        text = str(self)
        return text[len(self.option) + 1 :] if text.startswith(f"{self.option} ") else text


class OptionTypeError(OptionError, TypeError):
    """A Trainer option's value has a type the option never takes (a TypeError, where Lightning raises one)."""


# ----- checks ---------------------------------------------------------------------------------------
def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_text(v: Any, text: str) -> bool:
    return isinstance(v, str) and v == text


def int_from(lo: int, none: bool = False) -> Callable[[Any], bool]:
    return lambda v: (none and v is None) or (is_int(v) and v >= lo)


def must(ok: Callable[[Any], bool], what: str) -> Check:
    """A check that says ``<name> must be <what>, got <value>``."""

    def check(name: str, value: Any) -> None:
        if not ok(value):
            raise OptionError(name, f"{name} must be {what}, got {value!r}")

    return check


def choice(
    choices: Iterable[str] | Callable[[], Iterable[str]], ints: bool = False, none: bool = False
) -> Check:
    """One of `choices` (a callable is asked at check time: strategies can be registered later)."""

    def check(name: str, value: Any) -> None:
        if none and value is None:
            return
        valid = list(choices() if callable(choices) else choices)
        if (isinstance(value, str) or (ints and is_int(value))) and str(value) in valid:
            return
        listed = ", ".join(repr(c) for c in valid)
        hint = did_you_mean(str(value), valid)
        raise OptionError(name, f"unknown {name} {value!r}{hint} (valid: {listed})", hint)

    return check


def check_accelerator(name: str, value: Any) -> None:
    if isinstance(value, str) and value in REFUSED_ACCELERATORS:
        raise OptionError(
            name,
            f"{name} {value!r} is not supported by Tandem; use 'cuda' (or 'gpu'), 'cpu', 'mps' or 'auto'",
        )
    if not isinstance(value, str) and value is not None:
        raise OptionError(
            name, f"{name} must be a name ('auto', 'cpu', 'cuda', 'gpu', 'mps'), got {type(value).__name__}"
        )
    choice(ACCELERATORS)(name, value)


def check_devices(name: str, value: Any) -> None:
    """A count, -1, 'auto', a string of a count or indices, or a list of indices (trainer/devices.py); a list
    holding other than ints, or a value of another type, is a TypeError (as Lightning's)."""
    from trainer.devices import valid_form

    if valid_form(value):
        return
    what = "an int >= 1, -1, 'auto', a string like '2' or '0,1', or a list of indices"
    wrong_type = isinstance(value, bool) or not isinstance(value, (int, str, list, tuple))
    if isinstance(value, (list, tuple)):
        wrong_type = not all(isinstance(d, int) and not isinstance(d, bool) for d in value)
    kind = OptionTypeError if wrong_type else OptionError
    raise kind(name, f"{name} must be {what}, got {value!r}")


def check_precision(name: str, value: Any) -> None:
    from strategies.precision import PRECISIONS, REFUSED

    if isinstance(value, str) and value in REFUSED:
        raise OptionError(name, f"{REFUSED[value]}")
    choice(PRECISIONS, ints=True)(name, value)


def check_val_interval(name: str, value: Any) -> None:
    """Batches (an int >= 1), a fraction of the epoch (a float in (0, 1]) or a wall-time duration."""
    if (is_int(value) and value >= 1) or (isinstance(value, float) and 0.0 <= value <= 1.0) or whole(value):
        return
    if isinstance(value, (str, dict)) or type(value).__name__ == "timedelta":
        check_duration(name, value)
        return
    raise OptionError(
        name,
        f"{name} must be an int >= 1 (batches), a float in [0, 1] (a fraction of the epoch) or a duration "
        f"('DD:HH:MM:SS', a timedelta or a dict of its keywords), got {value!r}",
    )


def check_profiler(name: str, value: Any) -> None:
    from trainer.profiler import PROFILERS, REFUSED, Profiler

    if value is None or isinstance(value, Profiler):
        return
    if isinstance(value, str) and value.lower() in REFUSED:
        raise OptionError(name, REFUSED[value.lower()])
    if not isinstance(value, str):
        raise OptionError(
            name,
            f"{name} must be a name or a Profiler (trainer/profiler.py, or your subclass of it), got "
            f"{type(value).__name__}",
        )
    choice(PROFILERS)(name, value.lower())


def check_model_registry(name: str, value: Any) -> None:
    if value is not None:
        raise OptionError(
            name,
            f"{name} must be None: Tandem has no model registry (Lightning's uploads to Lightning AI's hub), got "
            f"{value!r}; upload the checkpoint ModelCheckpoint writes yourself",
        )


def strategy_names() -> list[str]:
    from strategies import STRATEGIES

    return ["auto", *STRATEGIES]


def check_strategy(name: str, value: Any) -> None:
    from strategies import REFUSED
    from strategies.base import Strategy

    if isinstance(value, Strategy):
        return
    if isinstance(value, str):  # Lightning's names are case-insensitive ("DDP")
        value = value.lower()
    if isinstance(value, str) and value in REFUSED:
        raise OptionError(name, REFUSED[value])
    if not isinstance(value, str):
        raise OptionError(name, f"{name} must be a name or a Strategy instance, got {type(value).__name__}")
    choice(strategy_names)(name, value)


def check_logger(name: str, value: Any) -> None:
    if value is None or isinstance(value, bool):
        return
    from trainer.loggers import Logger

    for item in value if isinstance(value, (list, tuple)) else [value]:
        # any object with log_metrics is taken as a logger (Lightning's duck typing: a user's own class, a mock)
        if not isinstance(item, Logger) and not callable(getattr(item, "log_metrics", None)):
            raise OptionError(
                name, f"{name} must be True, False, a Logger or a list of Loggers; got {type(item).__name__}"
            )


def check_callbacks(name: str, value: Any) -> None:
    if value is None:
        return
    from callbacks.base import Callback

    for item in value if isinstance(value, (list, tuple)) else [value]:
        if not isinstance(item, Callback):
            raise OptionError(name, f"{name} must be Callback instances; got {type(item).__name__}")


def check_duration(name: str, value: Any) -> None:
    if value is None:
        return
    from callbacks.timer import parse_duration  # the Timer that max_time adds reads it the same way

    try:
        parse_duration(value)
    except ConfigError as e:  # its message says which forms there are, or why this one is unusable
        raise OptionError(name, f"{name} must be a usable duration: {e}") from None


def check_clip_val(name: str, value: Any) -> None:
    """gradient_clip_val: a finite number >= 0 or None; a value that is no number is a TypeError (Lightning's)."""
    if value is None or finite_at_least_0(value):
        return
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    kind = OptionError if number else OptionTypeError
    raise kind(name, f"{name} must be a number >= 0 (finite) or None, got {value!r}")


def finite_at_least_0(v: Any) -> bool:
    return (is_int(v) and v >= 0) or (isinstance(v, float) and math.isfinite(v) and v >= 0)


def whole(v: Any) -> bool:
    """A float above 1 with nothing after the point (5.0), which Lightning reads as that many batches."""
    return isinstance(v, float) and v > 1 and v.is_integer()


def batches(v: Any) -> bool:
    return (is_int(v) and v >= 0) or (isinstance(v, float) and 0.0 <= v <= 1.0) or whole(v)


LIMIT = must(batches, "an int >= 0 (batches), a float in [0, 1] (fraction) or a whole float (5.0: 5 batches)")
FLAG = must(lambda v: isinstance(v, bool), "true or false")


def check_plugins(name: str, value: Any) -> None:
    """None, a plugin or a list of plugins of Lightning's kinds (strategies/plugins.py: precision, checkpoint IO,
    cluster environment, layer sync), at most one of each; anything else is refused naming the kinds."""
    from strategies.plugins import sort_plugins

    try:
        sort_plugins(value)
    except ConfigError as e:
        raise OptionError(name, str(e)) from None
