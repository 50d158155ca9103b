"""Snapshot: what a tuning run (the learning-rate range test, batch-size trials) changes, kept in memory and
put back exactly afterwards: weights and every buffer (persistent or not), gradients, modes, optimizer, scheduler and strategy states,
the loop's position, the random generators, and the callbacks, hooks, loggers, metrics and options in use.
Lightning restores from a temporary checkpoint file; this writes no file."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

import torch

from trainer.loggers.metrics import MetricStore
from trainer.loop.hooks import Hooks
from trainer.seed import get_rng_state, set_rng_state

if TYPE_CHECKING:
    from trainer.trainer import Trainer


class Snapshot:
    """``snap = Snapshot(trainer); ...trial...; snap.restore()``. While the trial runs, `isolate` gives it
    its own callbacks (hooks), no loggers and a fresh metric store, as Lightning swaps them out."""

    def __init__(self, t: Trainer) -> None:
        task, session = t.task, t.session
        assert task is not None
        self.t = t
        # before the loaders are asked for (as Lightning's isolate_rng around the whole search): a data set
        # drawn at random when built is drawn again the same for the next search, so searches repeat
        self.rng = get_rng_state()
        if (
            session is not None
        ):  # the trials need the loaders, which a stage asks for only when it first needs them
            if session.stage == "fit":
                session.load("train")
                if session.val_enabled:
                    session.load("val")
            else:
                session.load({"validate": "val"}.get(session.stage, session.stage))
        with torch.no_grad():
            self.weights = {k: v.detach().clone() for k, v in task.state_dict().items()}
            # every buffer, persistent or not (a state_dict leaves persistent=False ones out): the tensor
            # object a module holds and its values, so one replaced by a trial comes back as it was
            self.buffers = [
                (m, name, b, None if b is None else b.detach().clone())
                for m in task.modules()
                for name, b in m._buffers.items()
            ]
        self.grads = [None if p.grad is None else p.grad.detach().clone() for p in task.parameters()]
        self.modes = {m: m.training for m in task.modules()}
        self.optimizers = [copy.deepcopy(o.state_dict()) for o in t.optimizers]
        self.scheduler_configs = list(t.lr_scheduler_configs)
        self.schedulers = [copy.deepcopy(c.scheduler.state_dict()) for c in t.lr_scheduler_configs]
        self.strategy = copy.deepcopy(t.strategy.state_dict())
        self.loop = copy.deepcopy(vars(t.state))
        self.config = t.config
        self.kept = {name: getattr(t, name) for name in ("callbacks", "hooks", "loggers", "metric_store")}
        self.logged_metrics = dict(t.logged_metrics)
        self.loaders, self.loader_sizes = dict(t.loaders), {k: list(v) for k, v in t.loader_sizes.items()}
        self.loader_iterables = dict(t.loader_iterables)

    def isolate(self, callbacks: list[Any]) -> None:
        """Run the trial with only `callbacks` (and the task's hooks), no loggers, its own metrics."""
        t = self.t
        t.callbacks, t.loggers = list(callbacks), []
        t.hooks, transfer = Hooks(t.task, t.callbacks, t, t.profiler), t.hooks.transfer
        t.hooks.transfer = transfer
        t.metric_store = MetricStore(t.strategy.comm.reduce)
        t.metric_store.barebones = t.config.barebones

    def reset_loop(self) -> None:
        """The loop where it was, with the random generators as they were (before each trial)."""
        vars(self.t.state).update(copy.deepcopy(self.loop))
        set_rng_state(self.rng)

    def restore(self, weights: bool = True) -> None:
        """Everything as it was when the snapshot was taken (`weights=False` keeps the loaders reloaded since)."""
        t, task = self.t, self.t.task
        assert task is not None
        if weights:
            task.load_state_dict(self.weights)
            with torch.no_grad():
                for m, name, buffer, values in self.buffers:
                    m._buffers[name] = buffer
                    if buffer is not None:
                        buffer.copy_(values)
        for p, g in zip(task.parameters(), self.grads):
            p.grad = g
        for m, mode in self.modes.items():
            m.training = mode
        for opt, state in zip(t.optimizers, self.optimizers):
            opt.load_state_dict(state)
        t.lr_scheduler_configs[:] = self.scheduler_configs
        for cfg, state in zip(self.scheduler_configs, self.schedulers):
            cfg.scheduler.load_state_dict(state)
        t.strategy.load_state_dict(self.strategy)
        vars(t.state).update(self.loop)
        set_rng_state(self.rng)
        t.config = self.config
        for name, value in self.kept.items():
            setattr(t, name, value)
        t.logged_metrics.clear()
        t.logged_metrics.update(self.logged_metrics)

    def restore_loaders(self) -> None:
        self.t.loaders, self.t.loader_sizes = self.loaders, self.loader_sizes
        self.t.loader_iterables = self.loader_iterables
