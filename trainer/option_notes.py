"""What ``Trainer(**options)`` decides and says beyond each option's own check (trainer/option_checks.py), as
Lightning's Trainer does when it is built or when fit starts:

- ``PL_TRAINER_<OPTION>`` environment variables give an option's default (Lightning's names, so a cluster script
  that sets ``PL_TRAINER_MAX_STEPS=7`` works unchanged); an option passed to the Trainer wins;
- an explicit ``limit_*_batches`` / ``overfit_batches`` / ``val_check_interval`` of exactly ``1`` or ``1.0`` is
  logged (info) with what it means, since the int counts batches and the float is a fraction;
- ``barebones=True`` with an option it turns off set to on is a ConfigError (a ValueError) naming it;
- ``max_epochs`` left unset reads back as None until fit starts, which then picks 1000 (with a warning) or -1;
- a run on the CPU of a machine with a GPU warns that the GPU is not used.
"""

from __future__ import annotations

import ast
import os
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tandem_core.rank_zero import rank_zero_info
from trainer.option_checks import OptionError
from trainer.options import BATCH_COUNTS

if TYPE_CHECKING:
    from trainer.trainer import Trainer


def env_defaults(cls_name: str, names: list[str], options: dict[str, Any]) -> dict[str, Any]:
    """`options` over the defaults that ``PL_<CLS_NAME>_<OPTION>`` variables give (a Python literal where the
    text reads as one, else the text)."""
    found: dict[str, Any] = {}
    for name in names:
        raw = os.environ.get(f"PL_{cls_name.upper()}_{name.upper()}")
        if raw is None:
            continue
        try:
            found[name] = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            found[name] = raw
    return {**found, **options}


def note_batch_limits(options: dict[str, Any]) -> None:
    """Log what an explicit 1 or 1.0 of a batch-count option means (none under fast_dev_run, which sets them)."""
    if options.get("fast_dev_run"):
        return
    overfit = options.get("overfit_batches") or 0
    for name in BATCH_COUNTS:
        if overfit and name in ("limit_train_batches", "limit_val_batches"):
            continue  # overfit_batches replaces them
        value = options.get(name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != 1:
            continue
        meanings, default, how = _ONE[int if isinstance(value, int) else float]
        rank_zero_info(f"`Trainer({name}={value})` was configured so {meanings.get(name, default)} ({how}).")


# what an explicit 1 (int: one batch) or 1.0 (float: the whole) means, per option: (by option, otherwise, why)
_ONE: dict[type, tuple[dict[str, str], str, str]] = {
    int: (
        {
            "limit_train_batches": "1 batch per epoch is run",
            "val_check_interval": "validation will run after every training batch",
        },
        "1 batch is run",
        "an int counts batches",
    ),
    float: (
        {
            "limit_train_batches": "100% of the batches per epoch are run",
            "val_check_interval": "validation will run at the end of each training epoch",
        },
        "100% of the batches are run",
        "a float is a fraction",
    ),
}


def check_val_schedule(options: dict[str, Any]) -> None:
    """``check_val_every_n_epoch=None`` counts batches across epochs, so a fractional val_check_interval (of an
    epoch) has no meaning there: refused, as in Lightning."""
    interval = options.get("val_check_interval")
    if "check_val_every_n_epoch" in options and options["check_val_every_n_epoch"] is None:
        if isinstance(interval, float):
            raise OptionError(
                "val_check_interval",
                f"val_check_interval={interval!r} is a fraction of an epoch, but check_val_every_n_epoch=None "
                "validates by batches counted over the whole run: pass an int (every n training batches) or "
                "a duration ('DD:HH:MM:SS', a timedelta or a dict of its keywords).",
            )


def _on(value: Any) -> bool:
    return bool(value)


def _given(value: Any) -> bool:
    return value is not None and value is not False and value != 0


_BAREBONES_OFF: tuple[tuple[str, Callable[[Any], bool]], ...] = (
    ("enable_checkpointing", _on),
    ("logger", lambda v: v is not None and v is not False),
    ("enable_progress_bar", _on),
    ("log_every_n_steps", _given),
    ("enable_model_summary", _on),
    ("num_sanity_val_steps", _given),
    ("fast_dev_run", _given),
    ("detect_anomaly", _on),
    ("profiler", lambda v: v is not None),
)


def check_barebones(options: dict[str, Any]) -> None:
    """With ``barebones=True``, refuse an option it turns off that was set to on; then say what is off."""
    if not options.get("barebones"):
        return
    for name, on in _BAREBONES_OFF:
        if name in options and on(options[name]):
            raise OptionError(
                name,
                f"`Trainer(barebones=True, {name}={options[name]!r})` was passed, but barebones mode turns "
                f"{name} off (it measures the loop's own overhead); drop {name} or barebones=True.",
            )
    rank_zero_info(
        "Tandem is running in `Trainer(barebones=True)` mode: no checkpointing, progress bar, model summary, "
        "logger or self.log, sanity check, fast_dev_run, anomaly detection or profiler."
    )


def resolve_max_epochs(t: Trainer) -> None:
    """When fit starts with max_epochs unset: 1000 (and a PossibleUserWarning) unless max_steps or a Timer
    callback bounds the run, then -1 (no epoch limit); as Lightning."""
    if not t._max_epochs_unset:
        return
    import dataclasses

    from callbacks.timer import Timer
    from trainer.utilities.enums import PossibleUserWarning

    t._max_epochs_unset = False
    bounded = t.config.max_steps != -1 or any(isinstance(cb, Timer) for cb in t.callbacks)
    if not bounded:
        warnings.warn(
            "`max_epochs` was not set. Setting it to 1000 epochs (Trainer(max_epochs=-1) trains without an "
            "epoch limit).",
            PossibleUserWarning,
            stacklevel=4,
        )
    t.config = dataclasses.replace(t.config, max_epochs=-1 if bounded else 1000)


def warn_unused_gpu(strategy: Any) -> None:
    """Warn (rank 0) when the run computes on the CPU although a CUDA GPU is visible, as Lightning does."""
    import torch

    if strategy.root_device.type == "cpu" and torch.cuda.is_available():
        from tandem_core.rank_zero import rank_zero_warn

        rank_zero_warn(
            "GPU available but not used: the run computes on the CPU; set Trainer(accelerator='gpu') to use it"
        )
