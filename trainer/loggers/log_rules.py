"""Where `self.log` may be called and what it records there, hook by hook, as Lightning decides it.

Inside a training batch (training_step and what runs around its optimizer step) a value is a step value
unless asked otherwise; inside an evaluation batch it joins the epoch aggregate unless asked otherwise. The
hooks that open a stage's run or open or close an epoch take epoch aggregates only. Everywhere else (setup
and teardown, the fit and sanity-check hooks, the end of a stage's run, prediction, the checkpoint,
batch-transfer and model-mode hooks, configure_*, the dataloader methods) `self.log` is refused: log there
through `self.logger.experiment`. `tests/test_log_moments.py` logs from every hook under Lightning and Tandem
and compares what each allows and records.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Rule:
    """The defaults of on_step and on_epoch in a hook, and whether they may be set otherwise there."""

    on_step: bool
    on_epoch: bool
    batch: bool  # a batch-level hook: on_step and on_epoch may be set freely; else only epoch aggregates


TRAIN_BATCH = Rule(on_step=True, on_epoch=False, batch=True)
EVAL_BATCH = Rule(on_step=False, on_epoch=True, batch=True)
EPOCH = Rule(on_step=False, on_epoch=True, batch=False)

RULES: dict[str, Rule] = {
    **dict.fromkeys(
        (
            "training_step",
            "on_train_batch_start",
            "on_train_batch_end",
            "on_before_backward",
            "backward",
            "on_after_backward",
            "on_before_optimizer_step",
            "optimizer_step",
            "configure_gradient_clipping",
            "clip_gradients",
            "on_before_zero_grad",
            "optimizer_zero_grad",
        ),  # fmt: skip
        TRAIN_BATCH,
    ),
    **dict.fromkeys(
        (
            "validation_step",
            "test_step",
            "on_validation_batch_start",
            "on_validation_batch_end",
            "on_test_batch_start",
            "on_test_batch_end",
        ),  # fmt: skip
        EVAL_BATCH,
    ),
    **dict.fromkeys(
        (
            "on_train_start",
            "on_validation_start",
            "on_test_start",
            "on_train_epoch_start",
            "on_train_epoch_end",
            "on_validation_epoch_start",
            "on_validation_epoch_end",
            "on_test_epoch_start",
            "on_test_epoch_end",
        ),  # fmt: skip
        EPOCH,
    ),
}


def refusal(name: str, fx: str | None) -> str:
    """Why self.log(name) is refused while `fx` runs (None: no step or hook of the Trainer's)."""
    where = f"in {fx}" if fx is not None else "outside the Trainer's steps and hooks"
    return (
        f"self.log({name!r}) {where}: as in Lightning, self.log records only in the training, validation and "
        "test steps, the hooks around their batches and the hooks that start a stage's run or start or end an "
        "epoch (docs/logging.md, 'Where self.log records'). Log elsewhere through self.logger.experiment."
    )


def epoch_only(name: str, fx: str, on_step: bool, on_epoch: bool) -> str:
    """Why on_step=True or on_epoch=False is refused in an epoch-level hook."""
    return (
        f"self.log({name!r}, on_step={on_step}, on_epoch={on_epoch}) in {fx}: as in Lightning, a hook that "
        "starts a run or starts or ends an epoch records epoch aggregates only; pass on_step=False, "
        "on_epoch=True (the defaults there)."
    )


def no_logger(name: str) -> str:
    """Lightning's warning for self.log(..., logger=True) in a stage that has no logger."""
    return (
        f"You called `self.log({name!r}, ..., logger=True)` but have no logger configured; the value is not "
        "written anywhere. Pass Trainer(logger=...) to write it, or drop `logger=True`."
    )
