"""Lightning's names for what a Trainer is doing (``trainer.state.fn``, ``.status``, ``.stage``): string enums, so
``trainer.state.fn == "fit"`` and ``== TrainerFn.FITTING`` both hold."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class _Named(str, Enum):
    """Equal to its value ("fit"); str() and repr() as Lightning's (``TrainerFn.FITTING``)."""


class TrainerFn(_Named):
    """The entry point that runs: fit, validate, test, predict."""

    FITTING = "fit"
    VALIDATING = "validate"
    TESTING = "test"
    PREDICTING = "predict"


class TrainerStatus(_Named):
    """Where a run is in its life."""

    INITIALIZING = "initializing"
    RUNNING = "running"
    FINISHED = "finished"
    INTERRUPTED = "interrupted"

    @property
    def stopped(self) -> bool:
        return self in (TrainerStatus.FINISHED, TrainerStatus.INTERRUPTED)


class RunningStage(_Named):
    """What the loop is doing now."""

    TRAINING = "train"
    SANITY_CHECKING = "sanity_check"
    VALIDATING = "validate"
    TESTING = "test"
    PREDICTING = "predict"

    @property
    def evaluating(self) -> bool:
        return self in (RunningStage.VALIDATING, RunningStage.TESTING, RunningStage.SANITY_CHECKING)

    @property
    def dataloader_prefix(self) -> str:
        """The prefix of this stage's loader method (``val`` for validation and the sanity check)."""
        return "val" if self in (RunningStage.VALIDATING, RunningStage.SANITY_CHECKING) else self.value


_PHASES = {"train": RunningStage.TRAINING, "val": RunningStage.VALIDATING, "test": RunningStage.TESTING,
           "predict": RunningStage.PREDICTING}  # fmt: skip


def running_stage(phase: str | None, sanity_checking: bool) -> RunningStage | None:
    """The RunningStage of the loop's `phase` ("train", "val", "test", "predict")."""
    if sanity_checking:
        return RunningStage.SANITY_CHECKING
    return _PHASES.get(phase) if phase is not None else None


@dataclass
class TrainerState:
    """Lightning's view of a Trainer's state (``trainer.state == TrainerState(status=..., fn=..., stage=...)``):
    Tandem's ``trainer.state`` compares equal to the TrainerState of the same status, entry point and stage."""

    status: TrainerStatus = TrainerStatus.INITIALIZING
    fn: TrainerFn | None = None
    stage: RunningStage | None = None

    @property
    def finished(self) -> bool:
        return self.status == TrainerStatus.FINISHED

    @property
    def stopped(self) -> bool:
        return self.status.stopped
