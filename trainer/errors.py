"""The errors a user can cause, under their public name (defined in the bottom layer, tandem_core.errors)."""

from tandem_core.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    ConfigError,
    DistributedError,
    FaultToleranceError,
    IncompatibleCheckpointError,
    MissingExtraError,
    MissingFieldError,
    TandemError,
    TaskError,
    check_choice,
    did_you_mean,
    require,
)

__all__ = [
    "CheckpointError",
    "CheckpointNotFoundError",
    "ConfigError",
    "DistributedError",
    "IncompatibleCheckpointError",
    "FaultToleranceError",
    "MissingExtraError",
    "MissingFieldError",
    "TaskError",
    "TandemError",
    "check_choice",
    "did_you_mean",
    "require",
]
