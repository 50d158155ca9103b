"""What configure_optimizers returns, parsed into optimizers and scheduler configs; scheduler stepping."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from strategies.base import is_plain
from strategies.clipping import clip_gradients
from tandem_core.errors import ConfigError, TaskError
from tandem_core.optim import SchedulerConfig
from trainer.loop.hooks import run_as
from trainer.task.defaults import clipping_overridden

if TYPE_CHECKING:
    from trainer.trainer import Trainer


_SCHED_KEYS = {"scheduler", "interval", "frequency", "monitor", "strict", "name"}


def _sched_config(obj: Any, monitor: str | None) -> SchedulerConfig:
    if isinstance(obj, Mapping):
        unknown = set(obj) - _SCHED_KEYS
        if unknown or "scheduler" not in obj:
            raise TaskError(
                f"lr_scheduler dict must have 'scheduler' and only keys {sorted(_SCHED_KEYS)}; got {sorted(obj)}."
            )
        cfg = SchedulerConfig(**{"monitor": monitor, **obj})
    else:
        cfg = SchedulerConfig(scheduler=obj, monitor=monitor)
    if cfg.interval not in ("step", "epoch"):
        raise TaskError(f"lr_scheduler interval must be 'step' or 'epoch', got {cfg.interval!r}.")
    if cfg.is_plateau and not cfg.monitor:
        raise TaskError(
            "ReduceLROnPlateau needs a metric: return {'optimizer': opt, 'lr_scheduler': sched, "
            "'monitor': 'val/loss'} from configure_optimizers."
        )
    return cfg


def parse_optimizers(out: Any) -> tuple[list[torch.optim.Optimizer], list[SchedulerConfig]]:
    """Accept an optimizer, a list, (optimizers, schedulers), a dict or a list of dicts."""
    if isinstance(out, torch.optim.Optimizer):
        return [out], []
    if isinstance(out, Mapping):
        out = [out]
    if isinstance(out, Sequence) and len(out) == 2 and all(isinstance(x, Sequence) for x in out):
        opts, scheds = list(out[0]), list(out[1])
        return _check_opts(opts), [_sched_config(s, None) for s in scheds]
    if isinstance(out, Sequence) and out and all(isinstance(x, Mapping) for x in out):
        opts, scheds = [], []
        for d in out:
            if "optimizer" not in d:
                raise TaskError(f"configure_optimizers dict needs key 'optimizer'; got keys {sorted(d)}.")
            opts.append(d["optimizer"])
            if d.get("lr_scheduler") is not None:
                scheds.append(_sched_config(d["lr_scheduler"], d.get("monitor")))
        return _check_opts(opts), scheds
    if isinstance(out, Sequence) and out:
        return _check_opts(list(out)), []
    raise TaskError(
        f"configure_optimizers returned {type(out).__name__}; return an optimizer, a list of optimizers, "
        "or {'optimizer': ..., 'lr_scheduler': ...}."
    )


def _check_opts(opts: list[Any]) -> list[torch.optim.Optimizer]:
    for o in opts:
        if not isinstance(o, torch.optim.Optimizer):
            raise TaskError(
                f"configure_optimizers returned {type(o).__name__} where an optimizer was expected."
            )
    return opts


def step_schedulers(trainer: Trainer, interval: str, plateau: bool | None = None) -> None:
    """Step every scheduler of this interval whose frequency divides the step or epoch count (only the
    ReduceLROnPlateau ones, or only the others, when `plateau` says which: Lightning steps an epoch's other
    schedulers after its last batch and its plateau ones after on_train_epoch_end)."""
    count = trainer.state.global_step if interval == "step" else trainer.state.epoch + 1
    for cfg in trainer.lr_scheduler_configs:
        if cfg.interval != interval or count % cfg.frequency:
            continue
        if plateau is not None and cfg.is_plateau != plateau:
            continue
        if cfg.is_plateau:
            value = trainer.callback_metrics.get(cfg.monitor)  # type: ignore[arg-type]
            if value is None:
                if cfg.strict:
                    raise ConfigError(
                        f"ReduceLROnPlateau monitors {cfg.monitor!r}, which was not logged; logged keys: "
                        f"{sorted(trainer.callback_metrics)}. Log it with self.log or fix 'monitor'."
                    )
                continue
            _step_one(trainer, cfg.scheduler, value)  # the logged value itself, as Lightning passes it
        else:
            _step_one(trainer, cfg.scheduler, None)


def _step_one(trainer: Trainer, scheduler: Any, metric: Any) -> None:
    if "lr_scheduler_step" in trainer.hooks.custom:
        run_as(trainer, "lr_scheduler_step", trainer.task.lr_scheduler_step, scheduler, metric)  # type: ignore[union-attr]
    elif metric is None:
        scheduler.step()
    else:
        scheduler.step(metric)


def check_optimizers(optimizers: list[torch.optim.Optimizer], automatic: bool, accumulate: int) -> None:
    """Refuse combinations that automatic optimization cannot run, saying what to do instead."""
    if automatic and len(optimizers) > 1:
        raise TaskError(
            "automatic optimization supports one optimizer; for several set "
            "self.automatic_optimization = False and step them in training_step."
        )
    if not automatic and accumulate > 1:
        raise TaskError(
            "accumulate_grad_batches applies to automatic optimization only; with "
            "self.automatic_optimization = False step the optimizer every k batches yourself."
        )


def optimizer_step(
    trainer: Trainer, optimizer: torch.optim.Optimizer, closure: Callable[[], Any] | None = None
) -> Any:
    """The step through the strategy and precision, with Lightning's order: the closure (this batch's
    forward and backward) runs first, inside the step; then the gradients are made final (reduced, unscaled),
    on_before_optimizer_step runs, and (automatic optimization) gradients are clipped; then the update.
    An optimizer that calls the closure several times gets all of this each time."""
    return trainer.strategy.optimizer_step(optimizer, StepClosure(trainer, optimizer, closure))


class StepClosure:
    """What the strategy's optimizer step calls (see `optimizer_step`): `closure`, then the gradients made
    final, on_before_optimizer_step and clipping. Automatic optimization builds one per epoch (the loop's
    Closure is the same object at every step), manual optimization one per ``opt.step()``."""

    def __init__(
        self, trainer: Trainer, optimizer: torch.optim.Optimizer, closure: Callable[[], Any] | None
    ) -> None:
        self.trainer, self.optimizer, self.closure, self.strategy = (
            trainer,
            optimizer,
            closure,
            trainer.strategy,
        )
        self.before_step = trainer.hooks.caller("on_before_optimizer_step")
        self.unscale = None if is_plain(self.strategy) else self.strategy.unscale_gradients  # None: no-op
        task = trainer.task
        # Lightning clips only under automatic optimization; the default clipping methods do nothing
        # without a gradient_clip_val, so they are called only with one or where the task overrides them
        self.clips = (task is None or task.automatic_optimization) and (
            bool(trainer.config.gradient_clip_val)
            or ("configure_gradient_clipping" in trainer.hooks.custom and clipping_overridden(task))
        )
        # no unscaling, no on_before_optimizer_step, no clipping: calling this is calling `closure`
        self.only_calls_closure = self.unscale is None and self.before_step is None and not self.clips

    def __call__(self) -> Any:
        closure, optimizer = self.closure, self.optimizer
        result = closure() if closure is not None else None
        if self.unscale is not None:
            self.unscale(optimizer)
        if self.before_step is not None:
            self.before_step(optimizer)
        if self.clips:
            _clip(self.trainer, optimizer)
        return result


def _clip(trainer: Trainer, optimizer: torch.optim.Optimizer) -> None:
    cfg = trainer.config
    if "configure_gradient_clipping" in trainer.hooks.custom:
        trainer.task.configure_gradient_clipping(  # type: ignore[union-attr]
            optimizer,
            gradient_clip_val=cfg.gradient_clip_val,
            gradient_clip_algorithm=cfg.gradient_clip_algorithm,
        )
    elif cfg.gradient_clip_val:
        clip_gradients(optimizer, cfg.gradient_clip_val, cfg.gradient_clip_algorithm)


class TaskOptimizer:
    """Wraps an optimizer for manual optimization: step() goes through the strategy and counts steps."""

    def __init__(self, optimizer: torch.optim.Optimizer, trainer: Trainer) -> None:
        self._optimizer = optimizer
        self._trainer = trainer

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self._optimizer

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Step through the strategy (the closure, if any, runs inside it first) and count the step."""
        out = optimizer_step(self._trainer, self._optimizer, closure)
        self._trainer.state.global_step += 1
        return out

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._optimizer.zero_grad(set_to_none=set_to_none)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "_optimizer":  # unpickling asks before _optimizer exists
            raise AttributeError(name)
        return getattr(self._optimizer, name)

    def __repr__(self) -> str:
        """The wrapped optimizer's, prefixed ``Task`` (Lightning's wrapper prints ``Lightning`` + it)."""
        return f"Task{self._optimizer!r}"
