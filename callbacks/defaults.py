"""The callbacks a Trainer adds by itself (progress bar, checkpointing, model summary, timer) unless given."""

from __future__ import annotations

from typing import TYPE_CHECKING

from callbacks.base import Callback, check_state_keys
from callbacks.checkpoint import ModelCheckpoint
from callbacks.model_summary import ModelSummary
from callbacks.progress import ProgressBar, RichProgressBar, TQDMProgressBar
from callbacks.summary.rich_table import RichModelSummary
from callbacks.timer import Timer
from tandem_core.errors import ConfigError

if TYPE_CHECKING:
    from trainer.options import TrainerConfig


def default_callbacks(cfg: TrainerConfig, given: list[Callback]) -> list[Callback]:
    """The user's callbacks plus the defaults that the Trainer's enable_* flags ask for.

    Checkpoint callbacks go last, so that the state they save includes every other callback's update of
    the same hook (early stopping's patience counter, for instance).
    """
    cbs = list(given)

    def has(kind: type) -> bool:
        return any(isinstance(cb, kind) for cb in cbs)

    bars = [type(cb).__name__ for cb in cbs if isinstance(cb, ProgressBar)]
    if len(bars) > 1:  # two bars would draw over each other
        raise ConfigError(f"callbacks include {len(bars)} progress bars ({', '.join(bars)}); keep one.")
    if not cfg.fast_dev_run:  # fast_dev_run turns checkpointing off by itself; a given callback then idles
        for flag, kind in (("enable_progress_bar", ProgressBar), ("enable_checkpointing", ModelCheckpoint)):
            if not getattr(cfg, flag) and has(kind):
                raise ConfigError(
                    f"Trainer({flag}=False) but callbacks include a {kind.__name__}; remove one or the other."
                )
    if cfg.enable_progress_bar and not has(ProgressBar):
        cbs.append(TQDMProgressBar())
    if cfg.enable_model_summary and not has(ModelSummary):  # a rich bar gets a rich summary (Lightning's)
        cbs.append(RichModelSummary() if has(RichProgressBar) else ModelSummary())
    if cfg.enable_checkpointing and not has(ModelCheckpoint):
        cbs.append(ModelCheckpoint())
    if cfg.max_time is not None and not has(Timer):
        cbs.append(Timer(duration=cfg.max_time, interval="step"))
    check_state_keys(cbs)
    return [cb for cb in cbs if not hasattr(cb, "best_model_path")] + [
        cb for cb in cbs if hasattr(cb, "best_model_path")
    ]
