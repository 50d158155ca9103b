"""SpikeDetection: stop training when the loss jumps far above its recent mean (Lightning's callback)."""

from __future__ import annotations

import json
import os
from collections import deque
from typing import TYPE_CHECKING, Any

import torch

from callbacks.base import Callback
from tandem_core.errors import ConfigError, TandemError, check_choice

if TYPE_CHECKING:
    from trainer.task.base import Task
    from trainer.trainer import Trainer


class TrainingSpikeException(TandemError, RuntimeError):
    """The loss spiked; the batches around the spike were written to ``exclude_batches_path``."""

    def __init__(self, batch_idx: int) -> None:
        super().__init__(f"Training spike detected in batch {batch_idx}")


class SpikeDetection(Callback):
    """After each training batch (from batch `warmup` of an epoch on) the loss is a spike when it is worse than
        the previous one (larger for `mode` "min") and off the mean of the last `window` good losses by at least
        `atol` and `rtol` times that mean (each check skipped when None), or, with `finite_only`, not finite. Then
        the batch and the one before are appended to the JSON list `exclude_batches_path` (default
        ``<default_root_dir>/skip_batches.json``) and TrainingSpikeException is raised. Under several processes a
        spike on any rank stops every rank. The window is kept in checkpoints; the list's path is not taken from one
    (docs/reliability.md "No path from a checkpoint"). Example: ``SpikeDetection(rtol=2.0)``.
    """

    def __init__(
        self,
        mode: str = "min",
        window: int = 10,
        warmup: int = 1,
        atol: float | None = None,
        rtol: float | None = 2.0,
        exclude_batches_path: str | os.PathLike[str] | None = None,
        finite_only: bool = True,
    ) -> None:
        check_choice("SpikeDetection mode", mode, ("min", "max"))
        if not isinstance(window, int) or window < 1:
            raise ConfigError(f"SpikeDetection(window=...) must be an int >= 1, got {window!r}.")
        self.mode, self.window, self.warmup = mode, window, warmup
        self.atol, self.rtol = atol, rtol
        self.exclude_batches_path = exclude_batches_path
        self.finite_only = finite_only
        self.last_val: float = 0.0
        self.values: deque[float] = deque(maxlen=window)  # the last `window` losses taken into the mean
        self.bad_batches: list[int] = []

    @torch.no_grad()
    def on_train_batch_end(
        self, trainer: Trainer, task: Task, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if isinstance(outputs, torch.Tensor):
            loss = outputs.detach()
        elif isinstance(outputs, dict) and "loss" in outputs:
            loss = outputs["loss"].detach()
        else:
            raise TypeError(
                f"SpikeDetection needs the loss as training_step's output, got {type(outputs).__name__}."
            )
        if self.exclude_batches_path is None:
            self.exclude_batches_path = os.path.join(trainer.default_root_dir, "skip_batches.json")
        if not str(self.exclude_batches_path).endswith(".json"):
            self.exclude_batches_path = os.path.join(self.exclude_batches_path, "skip_batches.json")
        value = float(loss)
        comm = trainer.strategy.comm
        if comm.any_rank(batch_idx >= self.warmup and self._is_spike(value)):
            self._handle_spike(trainer, batch_idx)
        finite_everywhere = self.finite_only or not comm.any_rank(not torch.isfinite(loss).all())
        if finite_everywhere:
            self.values.append(value)
            self.last_val = value

    def _running_mean(self) -> float:
        return sum(self.values) / len(self.values) if self.values else 0.0

    def _is_spike(self, loss: float) -> bool:
        if self.finite_only and not torch.isfinite(torch.tensor(loss)):
            return True
        diff = loss - self.last_val
        if (diff <= 0) if self.mode == "min" else (diff >= 0):
            return False
        mean = self._running_mean()
        atol_ok = self.atol is None or abs(loss - mean) >= abs(self.atol)
        rtol_ok = self.rtol is None or abs(loss - mean) >= abs(self.rtol * mean)
        return atol_ok and rtol_ok

    def _handle_spike(self, trainer: Trainer, batch_idx: int) -> None:
        self.bad_batches.extend([batch_idx - 1, batch_idx])
        if trainer.is_global_zero:
            path = str(self.exclude_batches_path)
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            from tandem_core.fileio import atomic_write

            atomic_write(path, json.dumps(self.bad_batches, indent=4))
        raise TrainingSpikeException(batch_idx=batch_idx)

    def state_dict(self) -> dict[str, Any]:
        return {
            "last_val": self.last_val, "mode": self.mode, "warmup": self.warmup, "atol": self.atol,
            "rtol": self.rtol, "bad_batches": list(self.bad_batches), "values": list(self.values),
            "bad_batches_path": None if self.exclude_batches_path is None else str(self.exclude_batches_path),
        }  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.last_val, self.mode, self.warmup = state["last_val"], state["mode"], state["warmup"]
        self.atol, self.rtol, self.bad_batches = state["atol"], state["rtol"], list(state["bad_batches"])
        # "bad_batches_path" is not taken back (unlike Lightning): no path comes from a checkpoint, so the
        # list goes where this run's own argument (or default_root_dir) says, never to a restored name
        self.values = deque(state.get("values", []), maxlen=self.window)
