"""How a tuning trial runs: training steps through the Trainer's own loop (every strategy, precision and
accumulation as in fit), or one evaluation pass, with some options changed for the trial only."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from trainer.loop.data import num_batches
from trainer.loop.session import LIMIT

if TYPE_CHECKING:
    from trainer.trainer import Trainer


def _limit_loaders(t: Trainer, phase: str, limit: int | float) -> None:
    """Batches per epoch of `phase` under the trial's limit (the loaders were counted with the run's)."""
    t.loader_sizes[phase] = [num_batches(dl, limit) for dl in t.loaders.get(phase, [])]


def run_fit_trial(t: Trainer, options: dict[str, Any]) -> None:
    """Lightning's fit loop run with `options` (max_steps, limit_*_batches): on_train_start, epochs until a
    limit or a stop request, on_train_end. No sanity check and no on_fit_start/end: a trial runs inside fit."""
    from trainer.loop.fit import train_epoch

    t.config = dataclasses.replace(t.config, **options)
    for phase in ("train", "val"):
        if LIMIT[phase] in options:
            _limit_loaders(t, phase, options[LIMIT[phase]])
    t.hooks.call("on_train_start")
    while not _done(t):
        train_epoch(t)
    t.hooks.call("on_train_end")


def run_eval_trial(t: Trainer, phase: str, limit: int) -> None:
    """One pass of `phase` ("val", "test", "predict") over at most `limit` batches per loader."""
    from trainer.loop.evaluation import run_eval

    _limit_loaders(t, phase, limit)
    run_eval(t, phase)


def _done(t: Trainer) -> bool:
    cfg, state = t.config, t.state
    return (
        (cfg.max_steps != -1 and state.global_step >= cfg.max_steps)
        or (cfg.max_epochs != -1 and state.epoch >= cfg.max_epochs)
        or state.should_stop
    )
