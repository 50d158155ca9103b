"""BaseFinetuning (freeze modules before training, unfreeze them into new parameter groups later) and
BackboneFinetuning (Lightning's schedule for a task's `backbone`)."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Generator, Iterable
from typing import TYPE_CHECKING, Any

import torch
from torch.nn import Module, ModuleDict
from torch.nn.modules.batchnorm import _BatchNorm

from callbacks.base import Callback
from tandem_core.errors import ConfigError

if TYPE_CHECKING:
    from trainer.task.base import Task
    from trainer.trainer import Trainer

log = logging.getLogger(__name__)
Modules = Module | Iterable[Any]


def multiplicative(epoch: int) -> float:
    """BackboneFinetuning's default: the backbone's learning rate doubles every epoch."""
    return 2.0


class BaseFinetuning(Callback):
    """Subclass it: ``freeze_before_training(task)`` freezes modules when a stage is set up,
    ``finetune_function(task, epoch, optimizer)`` unfreezes them at the start of an epoch (typically with
    ``unfreeze_and_add_param_group``). The parameter groups it adds are kept in checkpoints by parameter name,
    so that a resumed run rebuilds them before the optimizer's state is loaded. Example::

        class Unfreeze(BaseFinetuning):
            def freeze_before_training(self, task): self.freeze(task.encoder)
            def finetune_function(self, task, epoch, optimizer):
                if epoch == 3: self.unfreeze_and_add_param_group(task.encoder, optimizer, lr=1e-4)
    """

    def __init__(self) -> None:
        self._internal_optimizer_metadata: dict[int, list[dict[str, Any]]] = {}
        self._restarting = False
        self._trainer: Trainer | None = None
        self._done_epoch = -1  # the last epoch whose finetune_function ran
        self._frozen: dict[str, Any] = {}  # which parameters train, which batch norms track statistics

    def state_dict(self) -> dict[str, Any]:
        return {
            "internal_optimizer_metadata": self._internal_optimizer_metadata,
            "done_epoch": self._done_epoch,
            **self._frozen,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._restarting = True
        self._done_epoch = int(state.get("done_epoch", -1))
        self._frozen = {k: state[k] for k in ("requires_grad", "track_running_stats") if k in state}
        meta = state.get("internal_optimizer_metadata", state)
        self._internal_optimizer_metadata = {int(k): v for k, v in meta.items()}
        t = self._trainer
        if t is not None and t.optimizers and t.task is not None:  # the optimizers exist: rebuild groups now
            self._restore_param_groups(t, t.task)

    def on_fit_start(self, trainer: Trainer, task: Task) -> None:
        if self._restarting:  # (when a checkpoint's states come back before the optimizers are made)
            self._restore_param_groups(trainer, task)

    def _restore_param_groups(self, trainer: Trainer, task: Task) -> None:
        """The groups as they were, and the modules unfrozen as they were (setup froze them again; Lightning
        2.6 forgets this, and a backbone unfrozen before the checkpoint stays frozen after a resume)."""
        named = dict(task.named_parameters())
        for idx, optimizer in enumerate(trainer.optimizers):
            if idx in self._internal_optimizer_metadata:
                optimizer.param_groups = _map_params(self._internal_optimizer_metadata[idx], named)
        for name, flag in self._frozen.get("requires_grad", {}).items():
            named[name].requires_grad = flag
        modules = dict(task.named_modules())
        for name, flag in self._frozen.get("track_running_stats", {}).items():
            modules[name].track_running_stats = flag
        self._restarting = False
        _parameters_changed(trainer, task)

    def _record_frozen(self, task: Task) -> None:
        self._frozen = {
            "requires_grad": {n: p.requires_grad for n, p in task.named_parameters()},
            "track_running_stats": {
                n: m.track_running_stats for n, m in task.named_modules() if isinstance(m, _BatchNorm)
            },
        }

    # ----- helpers (Lightning's static methods) ----------------------------------------------------
    @staticmethod
    def flatten_modules(modules: Modules) -> list[Module]:
        """The leaf modules (and modules with parameters of their own) of a module or an iterable of them."""
        if isinstance(modules, ModuleDict):
            modules = modules.values()
        if isinstance(modules, Iterable):
            found: list[Module] = []
            for m in modules:
                found.extend(BaseFinetuning.flatten_modules(m))
            candidates: Iterable[Module] = found
        else:
            candidates = modules.modules()
        return [m for m in candidates if not list(m.children()) or m._parameters]

    @staticmethod
    def filter_params(modules: Modules, train_bn: bool = True, requires_grad: bool = True) -> Generator:
        """The parameters whose requires_grad equals `requires_grad` (batch norm skipped unless train_bn)."""
        for mod in BaseFinetuning.flatten_modules(modules):
            if isinstance(mod, _BatchNorm) and not train_bn:
                continue
            for param in mod.parameters(recurse=False):
                if param.requires_grad == requires_grad:
                    yield param

    @staticmethod
    def make_trainable(modules: Modules) -> None:
        """Unfreeze the modules (batch norm tracks running statistics again)."""
        for module in BaseFinetuning.flatten_modules(modules):
            if isinstance(module, _BatchNorm):
                module.track_running_stats = True
            for param in module.parameters(recurse=False):
                param.requires_grad = True

    @staticmethod
    def freeze_module(module: Module) -> None:
        """Freeze one module's own parameters (batch norm stops tracking running statistics)."""
        if isinstance(module, _BatchNorm):
            module.track_running_stats = False
        for param in module.parameters(recurse=False):
            param.requires_grad = False

    @staticmethod
    def freeze(modules: Modules, train_bn: bool = True) -> None:
        """Freeze the modules; with train_bn their batch-norm layers stay trainable."""
        for mod in BaseFinetuning.flatten_modules(modules):
            if isinstance(mod, _BatchNorm) and train_bn:
                BaseFinetuning.make_trainable(mod)
            else:
                BaseFinetuning.freeze_module(mod)

    @staticmethod
    def filter_on_optimizer(optimizer: torch.optim.Optimizer, params: Iterable) -> list:
        """The parameters not already in one of the optimizer's groups (those are skipped with a warning)."""
        out, removed = [], []
        for param in params:
            held = any(torch.equal(p, param) for group in optimizer.param_groups for p in group["params"])
            (removed if held else out).append(param)
        if removed:
            warnings.warn(
                "some parameters to unfreeze are already in a group of this optimizer and are skipped; did "
                "configure_optimizers pass filter(lambda p: p.requires_grad, self.parameters())?",
                UserWarning,
                stacklevel=2,
            )
        return out

    @staticmethod
    def unfreeze_and_add_param_group(
        modules: Modules,
        optimizer: torch.optim.Optimizer,
        lr: float | None = None,
        initial_denom_lr: float = 10.0,
        train_bn: bool = True,
    ) -> None:
        """Unfreeze the modules and add their parameters as a new group with `lr`, or with the first group's
        rate divided by `initial_denom_lr` when lr is None."""
        BaseFinetuning.make_trainable(modules)
        params_lr = optimizer.param_groups[0]["lr"] if lr is None else float(lr)
        denom = initial_denom_lr if lr is None else 1.0
        params = BaseFinetuning.filter_params(modules, train_bn=train_bn, requires_grad=True)
        params = BaseFinetuning.filter_on_optimizer(optimizer, params)
        if params:
            optimizer.add_param_group({"params": params, "lr": params_lr / denom})

    # ----- hooks ---------------------------------------------------------------------------------
    def setup(self, trainer: Trainer, task: Task, stage: str) -> None:
        self._trainer = trainer
        self._done_epoch = -1  # a new run (a checkpoint's state, if any, is loaded after this)
        self.freeze_before_training(task)

    def on_train_epoch_start(self, trainer: Trainer, task: Task) -> None:
        """Call finetune_function for each optimizer and record the groups it added; once per epoch (a run
        resumed inside an epoch must not unfreeze again or change the rates twice)."""
        if trainer.current_epoch <= self._done_epoch:
            return
        self._done_epoch = trainer.current_epoch
        names = {p: n for n, p in task.named_parameters()}
        for idx, optimizer in enumerate(trainer.optimizers):
            before = len(optimizer.param_groups)
            self.finetune_function(task, trainer.current_epoch, optimizer)
            groups = optimizer.param_groups
            if idx not in self._internal_optimizer_metadata:
                self._internal_optimizer_metadata[idx] = _map_params(groups, names)
            elif before != len(groups):
                self._internal_optimizer_metadata[idx].extend(_map_params(groups[before:], names))
        self._record_frozen(task)
        _parameters_changed(trainer, task)

    def finetune_function(self, pl_module: Task, epoch: int, optimizer: torch.optim.Optimizer) -> None:
        """Unfreeze what should train from `epoch` on (override)."""
        raise NotImplementedError

    def freeze_before_training(self, pl_module: Task) -> None:
        """Freeze what should not train at first (override)."""
        raise NotImplementedError


def _parameters_changed(trainer: Trainer, task: Task) -> None:
    """Tell a strategy that reduces gradients of a fixed set of parameters (ddp) that the set may have changed,
    so that an unfrozen backbone's gradients are averaged over the processes too."""
    notify = getattr(trainer.strategy, "parameters_changed", None)
    if notify is not None:
        notify(task)


def _map_params(groups: list[dict[str, Any]], mapping: dict[Any, Any]) -> list[dict[str, Any]]:
    """Parameter groups with each parameter replaced through `mapping` (tensor -> name, or name -> tensor)."""
    return [
        {**{k: v for k, v in g.items() if k != "params"}, "params": [mapping[p] for p in g["params"]]}
        for g in groups
    ]


class BackboneFinetuning(BaseFinetuning):
    """Freezes ``task.backbone`` before training; at epoch `unfreeze_backbone_at_epoch` adds it to the optimizer
    with `backbone_initial_lr` (default: the first group's rate times `backbone_initial_ratio_lr`, divided by
    `initial_denom_lr` only when no rate is given), then multiplies its rate by ``lambda_func(epoch + 1)`` every
    epoch, capped at the first group's rate when `should_align`. Example: ``BackboneFinetuning(unfreeze_backbone_at_epoch=5)``.
    """

    def __init__(
        self,
        unfreeze_backbone_at_epoch: int = 10,
        lambda_func: Callable[[int], float] = multiplicative,
        backbone_initial_ratio_lr: float = 0.1,
        backbone_initial_lr: float | None = None,
        should_align: bool = True,
        initial_denom_lr: float = 10.0,
        train_bn: bool = True,
        verbose: bool = False,
        rounding: int = 12,
    ) -> None:
        super().__init__()
        self.unfreeze_backbone_at_epoch = unfreeze_backbone_at_epoch
        self.lambda_func = lambda_func
        self.backbone_initial_ratio_lr = backbone_initial_ratio_lr
        self.backbone_initial_lr = backbone_initial_lr
        self.should_align = should_align
        self.initial_denom_lr = initial_denom_lr
        self.train_bn = train_bn
        self.verbose = verbose
        self.rounding = rounding
        self.previous_backbone_lr: float | None = None

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "previous_backbone_lr": self.previous_backbone_lr}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.previous_backbone_lr = state["previous_backbone_lr"]
        super().load_state_dict(state)

    def setup(self, trainer: Trainer, task: Task, stage: str) -> None:
        if not isinstance(getattr(task, "backbone", None), Module):
            raise ConfigError(
                f"BackboneFinetuning needs a `backbone` attribute (an nn.Module) on {type(task).__name__}."
            )
        super().setup(trainer, task, stage)

    def freeze_before_training(self, pl_module: Task) -> None:
        self.freeze(pl_module.backbone)

    def finetune_function(self, pl_module: Task, epoch: int, optimizer: torch.optim.Optimizer) -> None:
        current_lr = optimizer.param_groups[0]["lr"]
        if epoch == self.unfreeze_backbone_at_epoch:
            initial = self.backbone_initial_lr
            initial = initial if initial is not None else current_lr * self.backbone_initial_ratio_lr
            self.previous_backbone_lr = initial
            self.unfreeze_and_add_param_group(
                pl_module.backbone,
                optimizer,
                initial,
                train_bn=self.train_bn,
                initial_denom_lr=self.initial_denom_lr,
            )
        elif epoch > self.unfreeze_backbone_at_epoch:
            assert self.previous_backbone_lr is not None
            nxt = self.lambda_func(epoch + 1) * self.previous_backbone_lr
            nxt = current_lr if self.should_align and nxt > current_lr else nxt
            optimizer.param_groups[-1]["lr"] = nxt
            self.previous_backbone_lr = nxt
        else:
            return
        if self.verbose:
            log.info(
                f"Current lr: {round(current_lr, self.rounding)}, "
                f"Backbone lr: {round(self.previous_backbone_lr, self.rounding)}"
            )
