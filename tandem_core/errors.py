"""Errors a user can cause. Each message says what to change."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class TandemError(Exception):
    """Base class of every error Tandem raises for a user mistake."""


class ConfigError(TandemError, ValueError):
    """A Trainer argument or config value is invalid."""


class TaskError(TandemError, RuntimeError):
    """A Task hook returned something Tandem cannot use, or the task cannot run as configured (a RuntimeError
    where Lightning raises one, e.g. a callback that needs automatic optimization)."""


class TaskTypeError(TaskError, TypeError):
    """A stage was given something that is no Task, or none at all (a TypeError too, as Lightning raises)."""


class NoDataError(TaskError, TypeError):
    """A stage has no data: none passed, no *_dataloader() defined, or one that returned None (a TypeError too,
    as Lightning raises one there)."""


class CheckpointError(TandemError):
    """A checkpoint is missing, unreadable, or belongs to a different model."""


class IncompatibleCheckpointError(CheckpointError, RuntimeError):
    """The checkpoint's weights do not fit the model (missing, unexpected or reshaped keys): a RuntimeError, as
    torch's ``load_state_dict`` raises."""


class NoTaskToSaveError(CheckpointError, AttributeError):
    """save_checkpoint with no task attached to the Trainer (an AttributeError too, as Lightning raises)."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """The checkpoint file asked for does not exist (a FileNotFoundError, as Lightning raises)."""


class DistributedError(TandemError):
    """Ranks disagree (shapes, unused parameters) or a collective failed."""


class LaunchError(DistributedError, RuntimeError):
    """Starting the workers would go wrong: a worker (LOCAL_RANK > 0) told by its cluster environment to start
    workers of its own (a RuntimeError too, as Lightning raises one there)."""


class FaultToleranceError(DistributedError):
    """In-place fault tolerance cannot go on: no lighthouse, no quorum of replica groups in time, a rejoining
    group that trains another model or config, a replica group left behind (strategies/fault_tolerance/)."""


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """Return ", did you mean 'x'?" for the closest choice, or ''."""
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return f", did you mean '{close[0]}'?" if close else ""


def check_choice(kind: str, value: str, choices: Iterable[str]) -> None:
    """Raise ConfigError if `value` is not among `choices`, listing them."""
    options = list(choices)
    if value not in options:
        valid = ", ".join(repr(c) for c in options)
        raise ConfigError(f"unknown {kind} {value!r}{did_you_mean(str(value), options)} (valid: {valid})")


class MissingExtraError(TandemError, ModuleNotFoundError):
    """An optional package a feature needs is not installed; the message names the pip extra."""


def require(module: str, feature: str, extra: str) -> None:
    """Raise MissingExtraError unless `module` can be imported (`feature` needs it; `extra` installs it)."""
    import importlib.util
    import sys

    # a module already imported counts (find_spec raises on one whose __spec__ is None: made at run time)
    if sys.modules.get(module) is None and importlib.util.find_spec(module) is None:
        raise MissingExtraError(
            f"{feature} needs the {module!r} package, which is not installed: "
            f"pip install 'tandem-trainer[{extra}]' (or pip install {module})."
        )


class MissingFieldError(ConfigError, AttributeError):
    """A feature needs a field the task lacks (the tuner's learning rate); an AttributeError too, as
    Lightning raises one there."""
