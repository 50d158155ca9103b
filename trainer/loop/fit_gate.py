"""Whether a fit trains at all, decided as Lightning's fit loop decides it, after the sanity check: a fit with
`limit_train_batches=0` never asks for its training loader, and a fit whose run is over before its first batch
(an empty training loader, max_steps or max_epochs already reached, a stop request) runs no training: no
on_train_start/on_train_end, no epoch, and the epoch counter stays where it was."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

from trainer.utilities.enums import PossibleUserWarning

if TYPE_CHECKING:
    from trainer.trainer import Trainer


def loads_train(t: Trainer) -> bool:
    """False when `limit_train_batches` is 0: Lightning does not even ask for the training loader then."""
    return t.config.limit_train_batches not in (0, 0.0)


def skips_training(t: Trainer, done: bool) -> bool:
    """True when the fit ends after its sanity check (`done`: the run's own end test, before any batch)."""
    return not loads_train(t) or t.num_training_batches == 0 or done


def warn_if_no_steps(t: Trainer) -> None:
    """A fit that will take no optimizer step says why (it still ends normally: that may be what was asked)."""
    cfg = t.config
    reason = (
        "max_steps=0" if cfg.max_steps == 0
        else "max_epochs=0" if cfg.max_epochs == 0
        else "limit_train_batches=0" if not loads_train(t)
        else "the training loader is empty" if t.num_training_batches == 0
        else None
    )  # fmt: skip
    if reason is not None and t.is_global_zero:
        warnings.warn(f"fit() will take no optimizer step: {reason}.", UserWarning, stacklevel=3)


def warn_if_epoch_shorter_than_logging(t: Trainer) -> None:
    """Lightning's warning when an epoch's training batches are fewer than `log_every_n_steps` (with a logger,
    outside fast_dev_run): such an epoch may log no step value at all."""
    n, every = t.num_training_batches, t.config.log_every_n_steps
    if t.loggers and n < every and not t.config.fast_dev_run and t.is_global_zero:
        warnings.warn(
            f"The number of training batches ({n}) is smaller than the logging interval "
            f"Trainer(log_every_n_steps={every}): lower log_every_n_steps to log steps within each epoch.",
            PossibleUserWarning,
            stacklevel=3,
        )
