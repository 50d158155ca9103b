"""The run's state as a live peer hands it over: what in-place fault tolerance (strategies/fault_tolerance/)
sends a rejoining replica group and how that group takes it. It is a checkpoint in memory: the same dict a
checkpoint file holds (trainer/checkpoint/run.py), of one rank, and restored as a resume from a file is."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from tandem_core.hooks import overrides
from trainer.checkpoint.format import encode
from trainer.checkpoint.run import contents, restore_callbacks, restore_training
from trainer.secrets import redact
from trainer.task.hparams import plain_hparams

if TYPE_CHECKING:
    from trainer.task.base import Task
    from trainer.trainer import Trainer


class LiveState:
    """The running fit, as a fault-tolerant strategy sees it (tandem_core's protocol of the same shape):

    - `snapshot(in_loop)`: this rank's state now, before fit's loop or between two of its optimizer steps, as
      a checkpoint dict;
    - `restore(ckpt, full, load_states)`: take a peer's; `load_states(ckpt)` loads weights and optimizer
      states (the strategy knows their layout), the rest is restored here: with `full`, as a resume from a
      checkpoint file (callbacks, DataModule, loop position, RNG, the loader's position), else only the
      schedulers' and the strategy's states (a group healed between two steps of the same position);
    - `position()` and `config()`: where the loop is, and what must agree for two groups to train together.
    """

    def __init__(self, t: Trainer) -> None:
        self.t = t

    @property
    def task(self) -> Task:
        assert self.t.task is not None
        return self.t.task

    @property
    def optimizers(self) -> list[torch.optim.Optimizer]:
        return list(self.t.optimizers)

    @property
    def micro_batches(self) -> int:
        """Loader batches per optimizer step on each rank (accumulate_grad_batches)."""
        return int(self.t.config.accumulate_grad_batches)

    def snapshot(self, in_loop: bool) -> dict[str, Any]:
        t = self.t
        states = {
            "state_dict": self.task.state_dict(),
            "optimizer_states": [o.state_dict() for o in t.optimizers],
        }
        s = t.state
        own = s.rank_state(None)  # (each rank sends its own)
        if not in_loop:
            # before fit's loop, what a resume from this group's own checkpoint read is not applied yet: the
            # RNG (set as the loop starts), the window's gradients (after zero_grad), a combined loader's
            # position. This group trains from those, so they are what it hands over, not the RNG of now
            pending = {
                "rng": s.resume_rng,
                "window_grads": s.window_grads,
                "combined": s.resume_combined,
                "loader_states": s.resume_loader_states,
            }
            own.update({k: v for k, v in pending.items() if v is not None})
        elif s.batch_in_epoch == 0 and s.epoch_start_rng is not None:
            # the epoch's first step: its loader was iterated already, which draws from the RNG; the joining
            # group iterates it again after taking the RNG, so it takes the RNG of before that draw
            own["rng"] = s.epoch_start_rng
        return contents(t, states, [own])

    def position(self) -> dict[str, int]:
        s = self.t.state
        return {"epoch": s.epoch, "global_step": s.global_step, "batch_in_epoch": s.batch_in_epoch}

    def config(self) -> dict[str, Any]:
        t, task = self.t, self.task
        hparams = redact(encode(plain_hparams(task.hparams)[0], "hyper_parameters"), t.config_secrets)
        cfg = t.config
        return {
            "task": f"{type(task).__module__}.{type(task).__qualname__}",
            "hyper_parameters": repr(hparams),
            "accumulate_grad_batches": cfg.accumulate_grad_batches,
            "max_epochs": cfg.max_epochs,
            "max_steps": cfg.max_steps,
            "limit_train_batches": repr(cfg.limit_train_batches),
            "precision": str(t.strategy.precision.name),
        }

    def restore(
        self, ckpt: dict[str, Any], full: bool, load_states: Callable[[dict[str, Any]], None]
    ) -> None:
        t, task = self.t, self.task
        if full and overrides(task, "on_load_checkpoint"):
            task.on_load_checkpoint(ckpt)
        load_states(ckpt)
        if full:
            restore_callbacks(t, ckpt, "fit")
        restore_training(t, ckpt, loop=full)
