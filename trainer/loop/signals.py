"""SIGINT/SIGTERM during fit: ask the loop to stop at the next agreed step boundary (it checkpoints first)."""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

import torch

from trainer import checkpoint
from trainer.seed import set_rng_state

if TYPE_CHECKING:
    from trainer.trainer import Trainer

GRACE_PER_GAP = 4  # ... plus this many times the longest gap measured between two stop agreements


def check_stop(t: Trainer, val_start_rng: dict[str, Any] | None = None) -> None:
    """A point where every rank agrees on a stop request (each step boundary, each validation batch):
    on agreement, checkpoint and exit. Measures the gap between such points for the watchdog's grace.
    Inside fit's validation, `val_start_rng` is the RNG state at that validation's start."""
    state, now = t.state, time.monotonic()
    if state.last_agreement is not None:
        state.agreement_gap = max(state.agreement_gap, now - state.last_agreement)
    state.last_agreement = now
    if t.strategy.comm.agree_stop(state.stop_signal is not None):
        stop_on_signal(t, val_start_rng)


class StopSignals:
    """Installs the handlers for one fit; a second signal stops at once (KeyboardInterrupt)."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        self.previous: dict[int, Any] = {}

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in (signal.SIGINT, signal.SIGTERM):
            self.previous[signum] = signal.getsignal(signum)
            signal.signal(signum, self._handle)

    def restore(self) -> None:
        for signum, previous in self.previous.items():
            signal.signal(signum, previous)
        self.previous = {}

    def _handle(self, signum: int, frame: Any) -> None:
        state, rank = self.trainer.state, self.trainer.global_rank
        if state.stop_signal is not None:
            if signum == signal.SIGINT:  # a second Ctrl-C: stop now
                raise KeyboardInterrupt
            # a repeated SIGTERM: a scheduler signals every process and the launcher forwards it too
            _say(
                f"[tandem] rank {rank} received {signal.Signals(signum).name} again; ignored (already stopping)"
            )
            return
        state.stop_signal = signum
        grace = self.trainer.config.stop_grace_s + GRACE_PER_GAP * state.agreement_gap
        _say(
            f"[tandem] rank {rank} received {signal.Signals(signum).name}: checkpointing at the next step boundary "
            f"(within {grace:.0f} s; press Ctrl-C twice to stop at once)"
        )
        watchdog = threading.Timer(grace, _stuck_exit, args=(rank, signum, grace))
        watchdog.daemon = True
        watchdog.start()


def _before_validation(t: Trainer, rng: dict[str, Any]) -> None:
    """Stopped inside fit's validation: describe the moment before it, so that resume repeats it (its
    metrics feed schedulers, early stopping and checkpoint selection) with the same random draws."""
    state = t.state
    if state.epoch_finished:  # the epoch's end: resume re-enters the epoch after its last batch and ends it
        # only after a full epoch on every rank (a loop cut short by a hook or by uneven data keeps its end)
        full = torch.tensor(
            float(state.batch_in_epoch == t.num_training_batches), device=t.strategy.root_device
        )
        if not t.strategy.comm.reduce(full, op="min").item():
            return
        state.epoch_finished = False
    else:  # a mid-epoch validation: resume runs it before the next batch (see LoopState.val_pending)
        state.val_pending = True
    set_rng_state(rng)  # the checkpoint records each rank's RNG as it was when the validation started


def _say(line: str) -> None:
    """Write to stderr from a signal handler: one unbuffered write, so it cannot re-enter a print that the
    signal interrupted (which raises RuntimeError in Python's buffered streams)."""
    os.write(2, (line + "\n").encode())


def _stuck_exit(rank: int, signum: int, grace: float) -> None:
    """The rank did not reach a step boundary after a stop signal: show where it is stuck, then exit."""
    print(
        f"[tandem] rank {rank} did not reach a step boundary within {grace:.0f} s of "
        f"{signal.Signals(signum).name}; exiting without a checkpoint. It is stuck here:",
        file=sys.stderr,
        flush=True,
    )
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    os._exit(128 + int(signum))


def stop_on_signal(t: Trainer, val_start_rng: dict[str, Any] | None = None) -> None:
    """SIGINT/SIGTERM reached a rank: every rank saves one checkpoint together, then exits 128+signal."""
    signum = t.state.stop_signal or signal.SIGTERM
    where = ""
    if t.config.enable_checkpointing:
        if val_start_rng is not None:
            _before_validation(t, val_start_rng)
        path = checkpoint.stop_path(t)
        checkpoint.save(t, path)
        where = f"; checkpoint saved to {path}"
    if t.is_global_zero:
        print(
            f"[tandem] stopping at global step {t.state.global_step} after {signal.Signals(signum).name}{where}",
            file=sys.stderr,
            flush=True,
        )
    raise SystemExit(128 + int(signum))
