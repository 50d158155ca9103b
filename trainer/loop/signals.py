"""SIGINT/SIGTERM during a stage: ask the loop to stop at the next point every rank agrees on (a step
boundary, an evaluation batch); fit checkpoints there first. Ctrl-C (SIGINT) then reaches the hooks'
on_exception as a KeyboardInterrupt, as in Lightning, and the process exits 130; SIGTERM exits 143. Under
SLURM (or with a SLURMEnvironment plugin) the requeue signal, SIGUSR1 by default, stops fit the same way and
then requeues the job (trainer/plugins/environments.py). A second Ctrl-C raises KeyboardInterrupt at once."""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from strategies.agreement import LAG
from trainer import checkpoint
from trainer.seed import set_rng_state

if TYPE_CHECKING:
    from trainer.trainer import Trainer

_monotonic = time.monotonic
GRACE_PER_GAP = 4 + LAG  # ... plus this many times the longest gap measured between two stop agreements
# what a rank contributes to the stop agreement (a MAX over ranks), which every rank then acts on whichever
# signal it got itself (or none yet): a requeue only when no rank got another stop signal (SIGTERM from scancel
# or preemption must not requeue a job SLURM is ending); a Ctrl-C (KeyboardInterrupt, exit 130) unless some rank
# got SIGTERM (exit 143)
NO_STOP, REQUEUE, INTERRUPT, TERMINATE = 0, 1, 2, 3


def check_stop(t: Trainer, val_start_rng: dict[str, Any] | None = None) -> None:
    """A point where every rank agrees on a stop request (each step boundary, each validation batch):
    on agreement, checkpoint and exit. Measures the gap between such points for the watchdog's grace.
    Inside fit's validation, `val_start_rng` is the RNG state at that validation's start."""
    stop_checker(t)(val_start_rng)


def stop_checker(t: Trainer) -> Callable[..., None]:
    """`check_stop` for one trainer, its lookups done once: what the training loop calls at each step boundary.
    Under several processes the agreement reads no device value on the host (strategies/agreement.py): a stop
    requested on any rank is acted on by every rank `LAG` agreements later, at the same step."""
    state, comm = t.state, t.strategy.comm
    alone = comm.agrees_alone

    def check(val_start_rng: dict[str, Any] | None = None) -> None:
        now = _monotonic()
        gap = now - state.last_agreement  # (-inf at the first: last_agreement starts at +inf)
        state.last_agreement = now
        if gap > state.agreement_gap:
            state.agreement_gap = gap
        if state.stop_signal is None and alone:  # one process and no signal: nothing to agree on
            return
        signals = t.session.signals if t.session is not None else None
        mine = NO_STOP if state.stop_signal is None else _request(signals, state.stop_signal)
        agreed = comm.agree_stop(mine)
        if agreed:
            stop_on_signal(t, val_start_rng, agreed)

    return check


def settle_stop(t: Trainer, val_start_rng: dict[str, Any] | None = None) -> None:
    """The end of a pass of stop agreements (a training epoch's batches; an evaluation's batches that every rank
    has), on every rank: under several processes the agreement is completed here (this rank's request posted
    once more, every answer in flight awaited: one round-trip per pass, none per step), so a stop requested on
    any rank before this point is acted on by every rank, here at the latest, and never left for after the
    stage. One process has acted at each step boundary already."""
    comm = t.strategy.comm
    if comm.agrees_alone:
        return
    signals = t.session.signals if t.session is not None else None
    signum = t.state.stop_signal
    agreed = comm.settle_stop(NO_STOP if signum is None else _request(signals, signum))
    if agreed:
        stop_on_signal(t, val_start_rng, agreed)


def _request(signals: StopSignals | None, signum: int) -> int:
    """This rank's part of the stop agreement for the signal it received."""
    return signals.code(signum) if signals is not None else TERMINATE


class StopSignals:
    """Installs the handlers for one stage; a second Ctrl-C stops at once (KeyboardInterrupt). `fit`: the
    stage is fit, whose stop checkpoints and may requeue the job; an evaluation stage only stops."""

    def __init__(self, trainer: Trainer, fit: bool = True) -> None:
        from trainer.plugins.environments import environment_of

        self.trainer = trainer
        self.previous: dict[int, Any] = {}
        self.environment = environment_of(trainer.config.plugins) if fit else None  # SLURM's, or None
        self.requeue_signal = self.environment.requeue_signal if self.environment is not None else None
        self.requeue_pending = False  # the ranks agreed on a requeue stop: rank 0 requeues on the way out
        self.stopped: BaseException | None = (
            None  # the agreed stop's exception: this process is on its way out
        )
        self.watchdog: threading.Timer | None = None  # armed by a stop signal, until the stage ends

    def code(self, signum: int) -> int:
        """This rank's part of the stop agreement for a received signal."""
        if signum == self.requeue_signal:
            return REQUEUE
        return INTERRUPT if signum == signal.SIGINT else TERMINATE

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in (signal.SIGINT, signal.SIGTERM, self.requeue_signal):
            if signum is not None:
                self.previous[signum] = signal.getsignal(signum)
                signal.signal(signum, self._handle)

    def restore(self) -> None:
        """Put the previous handlers back; after an agreed requeue stop, requeue the job first (rank 0) and
        keep ignoring SIGTERM, which SLURM sends to every task of the job it requeues, while this exits."""
        if self.watchdog is not None:  # the stage ended (saved, or failed with its own error): not stuck
            self.watchdog.cancel()
            self.watchdog = None
        if self.requeue_pending:
            self.requeue_pending = False
            self.previous.pop(signal.SIGTERM, None)
            self._requeue()
        elif self.stopped is not None and self.trainer.world_size > 1:
            # every rank stops at the same step; the launcher's agent sends SIGTERM to the ranks still exiting
            # when the first one is gone, and a Ctrl-C passed on by the launcher may reach a rank only after the
            # agreement stopped it: each rank ends its own way (its hooks, its exit status), not by them
            self.previous.pop(signal.SIGTERM, None)
            self.previous.pop(signal.SIGINT, None)
        for signum, previous in self.previous.items():
            signal.signal(signum, previous)
        self.previous = {}

    def _requeue(self) -> None:
        t = self.trainer
        if not t.is_global_zero or self.environment is None:
            return
        if not t.config.enable_checkpointing:
            print("[tandem] not requeued: enable_checkpointing=False, so nothing was saved to resume from",
                  file=sys.stderr, flush=True)  # fmt: skip
            return
        done, said = self.environment.requeue()
        if done and t.config.resume != "auto":
            said += "; it resumes only with Trainer(resume='auto') (or a ckpt_path)"
        print(f"[tandem] {said}", file=sys.stderr, flush=True)

    def _handle(self, signum: int, frame: Any) -> None:
        self._stop(signum)
        previous = self.previous.get(signum) if signum == signal.SIGTERM else None
        if callable(previous):  # as Lightning: a SIGTERM handler installed before the stage runs too
            previous(signum, frame)

    def _stop(self, signum: int) -> None:
        state, rank = self.trainer.state, self.trainer.global_rank
        if state.stop_signal is None and self.stopped is not None:
            # the first signal this rank gets, after the ranks' agreement already stopped it (another rank got
            # one first): it is on its way out, as asked; a further Ctrl-C still stops it at once
            state.stop_signal = signum
            _say(
                f"[tandem] rank {rank} received {signal.Signals(signum).name}; already stopping with the other ranks"
            )
            return
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
        then = ", then requeueing the job" if signum == self.requeue_signal else ""
        what = (
            "checkpointing at the next step boundary" if state.entry == "fit" else "stopping after this batch"
        )
        _say(
            f"[tandem] rank {rank} received {signal.Signals(signum).name}: {what}"
            f"{then} (within {grace:.0f} s; press Ctrl-C twice to stop at once)"
        )
        self.watchdog = threading.Timer(grace, _stuck_exit, args=(rank, signum, grace))
        self.watchdog.daemon = True
        self.watchdog.start()


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


def stop_on_signal(t: Trainer, val_start_rng: dict[str, Any] | None = None, agreed: int = TERMINATE) -> None:
    """The ranks agreed on a stop (`agreed`: the largest request, see NO_STOP...): in fit every rank saves one
    checkpoint together; then each raises KeyboardInterrupt for a Ctrl-C (the hooks' on_exception get it, as in
    Lightning; the stage then exits 130, see `exit_code`), SystemExit(128 + signal) for the others; every rank
    alike, also one that has not received the signal itself (yet)."""
    signals = t.session.signals if t.session is not None else None
    requeue = signals is not None and agreed == REQUEUE
    if requeue:
        signals.requeue_pending = True  # type: ignore[union-attr]
    signum = signals.requeue_signal if requeue else signal.SIGINT if agreed == INTERRUPT else signal.SIGTERM
    fit = t.state.entry == "fit"
    where = "" if fit else f"; {t.state.entry} stopped, nothing to save"
    if fit and t.config.enable_checkpointing:
        if val_start_rng is not None:
            _before_validation(t, val_start_rng)
        path = checkpoint.stop_path(t)
        checkpoint.save(t, path)
        checkpoint.finish(t, None)  # written in the background (AsyncCheckpointIO)? complete before a requeue
        where = f"; checkpoint saved to {path}"
    if t.is_global_zero:
        print(
            f"[tandem] stopping at global step {t.state.global_step} after {signal.Signals(signum).name}{where}",
            file=sys.stderr,
            flush=True,
        )
    stop: BaseException = KeyboardInterrupt() if signum == signal.SIGINT else SystemExit(128 + int(signum))
    if signals is not None:  # (a second Ctrl-C during the save above is a KeyboardInterrupt of its own)
        signals.stopped = stop
    raise stop


def exit_code(t: Trainer, error: BaseException | None) -> int | None:
    """128 + SIGINT when `error` is the KeyboardInterrupt of an agreed Ctrl-C stop (the stage has run its
    on_exception hooks with it; the process now exits 130, the stop checkpoint saved), else None."""
    signals = t.session.signals if t.session is not None else None
    if isinstance(error, KeyboardInterrupt) and signals is not None and error is signals.stopped:
        return 128 + int(signal.SIGINT)
    return None
