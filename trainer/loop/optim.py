"""What configure_optimizers returns, parsed into optimizers and scheduler configs; scheduler stepping."""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from strategies.base import is_plain
from strategies.clipping import clip_gradients
from tandem_core.errors import ConfigError, TaskError
from tandem_core.hooks import overrides
from tandem_core.optim import SchedulerConfig
from trainer.loop.hooks import run_as
from trainer.task.defaults import clipping_overridden

if TYPE_CHECKING:
    from trainer.trainer import Trainer


_SCHED_KEYS = {"scheduler", "interval", "frequency", "monitor", "strict", "name", "reduce_on_plateau"}
_OPTIM_KEYS = {"optimizer", "lr_scheduler", "monitor"}
_MANUAL_IGNORED = ("reduce_on_plateau", "monitor", "strict")  # manual optimization steps schedulers itself


class OptimizerSetupError(TaskError, RuntimeError):
    """configure_optimizers or training_step asks for what automatic optimization cannot do (several optimizers,
    an ``optimizer_idx`` argument); a RuntimeError, as Lightning raises for the same mistakes."""


class SchedulerApiError(TaskError, TypeError):
    """A learning-rate scheduler without ``state_dict``/``load_state_dict`` (it could not be checkpointed); a
    TypeError, as Lightning's."""


class NoOptimizer(torch.optim.Optimizer):
    """What fit steps when configure_optimizers returned None (Lightning's stand-in): runs the closure, updates
    nothing, saves no state."""

    def __init__(self) -> None:
        super().__init__([torch.zeros(1)], {})

    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        """Run `closure` (the batch's forward and backward) and change nothing."""
        return closure() if closure is not None else None

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Nothing to clear."""

    def state_dict(self) -> dict[str, Any]:
        """No state."""
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """No state to restore."""

    def __repr__(self) -> str:
        return "NoOptimizer()"


def _sched_config(obj: Any, monitor: str | None, automatic: bool = True) -> SchedulerConfig:
    if isinstance(obj, Mapping):
        unknown = set(obj) - _SCHED_KEYS
        if unknown:  # as Lightning: said and dropped
            warnings.warn(
                f"The lr_scheduler dict has keys Tandem does not know: {sorted(unknown)}; they are ignored "
                f"(known: {sorted(_SCHED_KEYS)}).",
                RuntimeWarning,
                stacklevel=5,
            )
        if "scheduler" not in obj:
            raise TaskError(
                f"lr_scheduler dict must have 'scheduler' (the scheduler itself); got keys {sorted(obj)}."
            )
        given = {k: v for k, v in obj.items() if k in _SCHED_KEYS and k != "reduce_on_plateau"}
        if not automatic:
            ignored = [k for k in obj if k in _MANUAL_IGNORED]
            if ignored:
                warnings.warn(
                    f"The lr_scheduler dict has {ignored}, which manual optimization ignores: call "
                    "scheduler.step(...) yourself in the task.",
                    RuntimeWarning,
                    stacklevel=5,
                )
            given = {k: v for k, v in given.items() if k not in _MANUAL_IGNORED}
            monitor = None
        cfg = SchedulerConfig(**{"monitor": monitor, **given})
    else:
        cfg = SchedulerConfig(scheduler=obj, monitor=monitor if automatic else None)
    if cfg.interval not in ("step", "epoch"):
        raise TaskError(f"lr_scheduler interval must be 'step' or 'epoch', got {cfg.interval!r}.")
    if automatic and cfg.is_plateau and not cfg.monitor:
        raise TaskError(
            "ReduceLROnPlateau needs a metric: return {'optimizer': opt, 'lr_scheduler': sched, "
            "'monitor': 'val/loss'} from configure_optimizers."
        )
    return cfg


def parse_optimizers(
    out: Any, automatic: bool = True
) -> tuple[list[torch.optim.Optimizer], list[SchedulerConfig]]:
    """Accept an optimizer, a list, (optimizers, schedulers), a dict or a list of dicts; None (with a warning, as
    Lightning) trains with `NoOptimizer`. `automatic=False` (manual optimization): the task steps the schedulers,
    so their monitor/strict keys are ignored (with a RuntimeWarning) and a ReduceLROnPlateau needs no monitor."""
    if out is None:
        warnings.warn(
            "configure_optimizers returned None: this fit runs with no optimizer (the parameters do not change).",
            UserWarning,
            stacklevel=4,
        )
        return [NoOptimizer()], []
    if isinstance(out, torch.optim.Optimizer):
        return [out], []
    if isinstance(out, Mapping):
        out = [out]
    if isinstance(out, Sequence) and len(out) == 2 and all(isinstance(x, Sequence) for x in out):
        opts, scheds = list(out[0]), list(out[1])
        return _checked(_check_opts(opts), [_sched_config(s, None, automatic) for s in scheds])
    if isinstance(out, Sequence) and out and all(isinstance(x, Mapping) for x in out):
        opts, scheds = [], []
        for d in out:
            if "optimizer" not in d:
                raise TaskError(f"configure_optimizers dict needs key 'optimizer'; got keys {sorted(d)}.")
            extra = set(d) - _OPTIM_KEYS
            if extra:
                warnings.warn(
                    f"The configure_optimizers dict has keys Tandem does not know: {sorted(extra)}; they are "
                    f"ignored (known: {sorted(_OPTIM_KEYS)}).",
                    RuntimeWarning,
                    stacklevel=4,
                )
            opts.append(d["optimizer"])
            if d.get("lr_scheduler") is not None:
                scheds.append(_sched_config(d["lr_scheduler"], d.get("monitor"), automatic))
        return _checked(_check_opts(opts), scheds)
    if isinstance(out, Sequence) and out:
        return _check_opts(list(out)), []
    raise TaskError(
        f"configure_optimizers returned {type(out).__name__}; return an optimizer, a list of optimizers, "
        "or {'optimizer': ..., 'lr_scheduler': ...}."
    )


def _checked(
    opts: list[torch.optim.Optimizer], scheds: list[SchedulerConfig]
) -> tuple[list[torch.optim.Optimizer], list[SchedulerConfig]]:
    """Refuse a scheduler that steps an optimizer configure_optimizers did not return, or that cannot be saved."""
    for cfg in scheds:
        sched = cfg.scheduler
        if not (
            callable(getattr(sched, "state_dict", None)) and callable(getattr(sched, "load_state_dict", None))
        ):
            raise SchedulerApiError(
                f"The lr scheduler {type(sched).__name__} has no state_dict()/load_state_dict(), so it could not "
                "be checkpointed; define both."
            )
        owner = getattr(sched, "optimizer", None)
        if owner is not None and not any(owner is o for o in opts):
            raise TaskError(
                f"A {type(sched).__name__} steps an optimizer that configure_optimizers did not return; build it "
                "on one of the returned optimizers."
            )
    return opts, scheds


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
                warnings.warn(
                    f"ReduceLROnPlateau monitors {cfg.monitor!r}, which was not logged (strict=False): this "
                    "step leaves the learning rate as it is.",
                    RuntimeWarning,
                    stacklevel=2,
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


def check_optimizers(
    optimizers: list[torch.optim.Optimizer],
    automatic: bool,
    accumulate: int,
    task: Any = None,
    schedulers: Sequence[SchedulerConfig] = (),
) -> None:
    """Refuse combinations that automatic optimization cannot run, saying what to do instead."""
    step = getattr(task, "training_step", None)
    if step is not None and "optimizer_idx" in _parameters(step):
        raise OptimizerSetupError(
            "training_step takes optimizer_idx, which Lightning 2 removed: several optimizers need manual "
            "optimization; drop the argument, set self.automatic_optimization = False and step "
            "`opt1, opt2 = self.optimizers()` in training_step."
        )
    if automatic and len(optimizers) > 1:
        raise OptimizerSetupError(
            "automatic optimization supports one optimizer; for several set "
            "self.automatic_optimization = False and step them in training_step."
        )
    custom_step = task is not None and overrides(task, "lr_scheduler_step")
    for cfg in schedulers if automatic and not custom_step else ():
        if not isinstance(
            cfg.scheduler, (torch.optim.lr_scheduler.LRScheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
        ):
            raise TaskError(
                f"The lr scheduler {type(cfg.scheduler).__name__} is not a torch LRScheduler, so Tandem cannot "
                "step it: override the task's lr_scheduler_step(scheduler, metric) to step it yourself."
            )
    if not automatic and accumulate > 1:
        raise TaskError(
            "accumulate_grad_batches applies to automatic optimization only; with "
            "self.automatic_optimization = False step the optimizer every k batches yourself."
        )


def _parameters(fn: Callable[..., Any]) -> list[str]:
    try:
        return list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return []


def optimizer_step(
    trainer: Trainer,
    optimizer: torch.optim.Optimizer,
    closure: Callable[[], Any] | None = None,
    **kwargs: Any,
) -> Any:
    """The step through the strategy and precision, with Lightning's order: the closure (this batch's
    forward and backward) runs first, inside the step; then the gradients are made final (reduced, unscaled),
    on_before_optimizer_step runs, and (automatic optimization) gradients are clipped; then the update.
    An optimizer that calls the closure several times gets all of this each time."""
    return trainer.strategy.optimizer_step(optimizer, StepClosure(trainer, optimizer, closure), **kwargs)


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
        group = getattr(trainer.strategy, "grad_norm_group", None)  # a pipeline's stages: the global norm
        clip_gradients(optimizer, cfg.gradient_clip_val, cfg.gradient_clip_algorithm, group)
