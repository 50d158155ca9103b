"""LoopState: where the loop is. The loop reads and advances it, checkpoints save it, callbacks and the
Task read it (``trainer.state``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from trainer.seed import get_rng_state
from trainer.states import RunningStage, TrainerFn, TrainerState, TrainerStatus, running_stage

STAGES = ("fit", "validate", "test", "predict")  # what the user runs
PHASES = ("train", "val", "test", "predict")  # what a loop is doing


@dataclass
class LoopState:
    """The loop's position and what a resumed run needs to continue exactly.

    Per-rank parts (the RNG snapshots, the gradients of an unfinished accumulation window) are saved as one
    entry per rank by the checkpoint code and given back to each rank by `load_state_dict(state, rank)`.
    """

    entry: str | None = None  # the entry point that runs: "fit", "validate", "test" or "predict"
    phase: str | None = None  # what the loop is doing: "train", "val", "test" or "predict"
    epoch: int = 0
    global_step: int = 0  # optimizer steps taken
    batch_in_epoch: int = 0  # training batches of the current epoch already consumed
    epoch_finished: bool = False  # the current epoch's training batches are exhausted (its end is running)
    val_pending: bool = False  # a mid-epoch validation is due after the current batch
    sanity_checking: bool = False
    should_stop: bool = False  # asked by a callback or the task (honoured once min_epochs/min_steps are met)
    stop_signal: int | None = None  # SIGINT/SIGTERM received during fit
    last_logged_step: int = -1
    last_agreement: float = math.inf  # monotonic time of the last stop agreement (trainer/loop/signals.py)
    agreement_gap: float = 0.0  # the longest time measured between two stop agreements
    epoch_start_rng: dict[str, Any] | None = None  # RNG snapshot at the start of the current epoch
    resume_rng: dict[str, Any] | None = None  # RNG snapshot of the checkpoint, applied once the loop resumes
    window_grads: list[torch.Tensor | None] | None = field(default=None, repr=False)  # restored mid-window
    # a combined training loader's pass (its position is saved) and that position read from a checkpoint
    combined: Any = field(default=None, repr=False)
    resume_combined: dict[str, Any] | None = field(default=None, repr=False)
    # the states of the training loaders that have state_dict/load_state_dict, read from a checkpoint
    resume_loader_states: list[Any] | None = field(default=None, repr=False)
    epoch_counted: bool = (
        False  # a fit ended inside `epoch - 1`, counted as done (Lightning); a resume continues it
    )
    status: TrainerStatus = TrainerStatus.INITIALIZING  # running, then finished or interrupted

    # ----- Lightning's names for the same state (trainer/states.py)
    @property
    def fn(self) -> TrainerFn | None:
        """The running entry point (``TrainerFn.FITTING`` == "fit"), or None before the first."""
        return TrainerFn(self.entry) if self.entry is not None else None

    @fn.setter
    def fn(self, value: TrainerFn | str | None) -> None:
        """Set the entry point (Lightning's tests set it before calling a Trainer method by hand)."""
        self.entry = None if value is None else TrainerFn(value).value

    @property
    def stage(self) -> RunningStage | None:
        """What the loop is doing now, as Lightning's ``trainer.state.stage``: ``RunningStage.TRAINING`` ("train"),
        ``SANITY_CHECKING``, ``VALIDATING``, ``TESTING``, ``PREDICTING``; None when no entry point runs."""
        if self.status != TrainerStatus.RUNNING or self.entry is None:
            return None
        if self.sanity_checking or self.phase in ("val", "test", "predict"):
            return running_stage(self.phase, self.sanity_checking)
        return running_stage({"fit": "train", "validate": "val"}.get(self.entry, self.entry), False)

    @stage.setter
    def stage(self, value: RunningStage | str | None) -> None:
        """Set what the loop is doing (Lightning's tests set it before driving a loop by hand)."""
        name = None if value is None else RunningStage(value).value
        self.sanity_checking = name == "sanity_check"
        self.phase = {"sanity_check": "val", "validate": "val"}.get(name, name) if name else None

    running_stage = stage

    @property
    def finished(self) -> bool:
        return self.status == TrainerStatus.FINISHED

    def __eq__(self, other: object) -> bool:
        """Equal to Lightning's TrainerState of the same status, entry point and stage; otherwise only to itself
        (two loop states are never compared field by field: they hold tensors)."""
        if isinstance(other, TrainerState):
            return (self.status, self.fn, self.stage) == (other.status, other.fn, other.stage)
        return self is other

    @property
    def stopped(self) -> bool:
        return self.status.stopped

    def mid_window(self, k: int, automatic: bool) -> bool:
        """True between the micro-batches of one optimizer step (automatic optimization)."""
        return automatic and k > 1 and not self.epoch_finished and self.batch_in_epoch % k != 0

    def state_dict(self, ranks: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """The checkpoint keys this state owns: Lightning's top-level "epoch" and "global_step", and "loop"
        with the rest of the position and, when given, every rank's own part (see `rank_state`)."""
        loop: dict[str, Any] = {
            "batch_in_epoch": self.batch_in_epoch,
            "epoch_finished": self.epoch_finished,
            "val_pending": self.val_pending,
        }
        if self.epoch_counted:
            loop["epoch_counted"] = True
        if ranks is not None:
            loop["ranks"] = ranks
        return {"epoch": self.epoch, "global_step": self.global_step, "loop": loop}

    def rank_state(self, grads: list[torch.Tensor | None] | None) -> dict[str, Any]:
        """This rank's own part: its RNG now and at the epoch's start, `grads` of an unfinished window, and the
        position of a combined training loader."""
        own = {"rng": get_rng_state(), "epoch_start_rng": self.epoch_start_rng, "window_grads": grads}
        if self.combined is not None:  # where each loader of a combined training loader is (loop/combined.py)
            own["combined"] = self.combined.position(self.batch_in_epoch)
            if own["combined"]["states"]:  # loaders with state_dict/load_state_dict (Lightning's Stateful)
                own["loader_states"] = own["combined"].pop("states")
        return own

    def load_state_dict(self, ckpt: dict[str, Any], rank: int = 0) -> None:
        """Restore what state_dict wrote, taking this rank's own part (a 1-process file serves every rank)."""
        loop = ckpt["loop"]
        self.epoch, self.global_step = int(ckpt["epoch"]), int(ckpt["global_step"])
        self.batch_in_epoch, self.epoch_finished = int(loop["batch_in_epoch"]), bool(loop["epoch_finished"])
        self.val_pending = bool(loop.get("val_pending", False))
        self.epoch_counted = False
        if loop.get("epoch_counted"):  # saved after a fit that stopped inside its epoch: continue that epoch
            self.epoch -= 1
        ranks = loop.get("ranks") or [{}]
        own = ranks[rank] if rank < len(ranks) else ranks[0]
        self.epoch_start_rng, self.resume_rng = own.get("epoch_start_rng"), own.get("rng")
        self.window_grads = own.get("window_grads")
        self.resume_combined = own.get("combined")
        self.resume_loader_states = own.get("loader_states")

    def count_cut_epoch(self) -> None:
        """A fit that stopped inside an epoch counts it as done, as Lightning's trainer.current_epoch does (in
        on_train_end, on_fit_end and a checkpoint saved after fit); `resume_cut_epoch` takes it back."""
        if not self.epoch_finished and self.batch_in_epoch and self.stop_signal is None:
            self.epoch, self.epoch_counted = self.epoch + 1, True

    def resume_cut_epoch(self) -> None:
        if self.epoch_counted:
            self.epoch, self.epoch_counted = self.epoch - 1, False

    def next_epoch(self) -> None:
        self.epoch += 1
        self.batch_in_epoch, self.epoch_finished = 0, False
