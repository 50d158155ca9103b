"""ModelPruning: prune the task's parameters with torch.nn.utils.prune at epoch ends (Lightning's callback)."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Sequence
from copy import deepcopy
from functools import partial
from typing import TYPE_CHECKING, Any

import torch.nn.utils.prune as pytorch_prune
from torch import Tensor, nn

from callbacks.base import Callback
from tandem_core.errors import ConfigError

if TYPE_CHECKING:
    from trainer.task.base import Task
    from trainer.trainer import Trainer

log = logging.getLogger(__name__)

_FUNCTIONS = {
    "ln_structured": pytorch_prune.ln_structured,
    "l1_unstructured": pytorch_prune.l1_unstructured,
    "random_structured": pytorch_prune.random_structured,
    "random_unstructured": pytorch_prune.random_unstructured,
}
_METHODS = {
    "ln_structured": pytorch_prune.LnStructured,
    "l1_unstructured": pytorch_prune.L1Unstructured,
    "random_structured": pytorch_prune.RandomStructured,
    "random_unstructured": pytorch_prune.RandomUnstructured,
}
ParamList = Sequence[tuple[nn.Module, str]]


class ModelPruning(Callback):
    """Prunes `parameters_to_prune` (default: every weight and bias of the task's layers) by `amount` (a
    fraction, a count, or a function of the epoch) with `pruning_fn` (a name above, a BasePruningMethod class
    or a function like torch's) at each training epoch's end (or validation epoch's end), globally over all of
    them or layer by layer. With `use_lottery_ticket_hypothesis` the surviving weights go back to their values
    from before training (re-drawn with `resample_parameters`). `make_pruning_permanent` removes the masks when
    training ends, and saves checkpoints without them. Every argument is Lightning's. Example::

        ModelPruning("l1_unstructured", amount=lambda epoch: 0.1 if epoch % 2 else 0.0)
    """

    PARAMETER_NAMES = ("weight", "bias")

    def __init__(
        self,
        pruning_fn: Callable | str,
        parameters_to_prune: ParamList = (),
        parameter_names: list[str] | None = None,
        use_global_unstructured: bool = True,
        amount: int | float | Callable[[int], int | float] = 0.5,
        apply_pruning: bool | Callable[[int], bool] = True,
        make_pruning_permanent: bool = True,
        use_lottery_ticket_hypothesis: bool | Callable[[int], bool] = True,
        resample_parameters: bool = False,
        pruning_dim: int | None = None,
        pruning_norm: int | None = None,
        verbose: int = 0,
        prune_on_train_epoch_end: bool = True,
    ) -> None:
        self._use_global_unstructured = use_global_unstructured
        self._parameters_to_prune = parameters_to_prune
        self._use_lottery_ticket_hypothesis = use_lottery_ticket_hypothesis
        self._resample_parameters = resample_parameters
        self._prune_on_train_epoch_end = prune_on_train_epoch_end
        self._parameter_names = parameter_names or self.PARAMETER_NAMES
        self._global_kwargs: dict[str, Any] = {}
        self._original_layers: dict[int, dict[str, Any]] | None = None
        self._pruning_method_name: str | None = None
        for name in self._parameter_names:
            if name not in self.PARAMETER_NAMES:
                raise ConfigError(f"parameter_names: {name!r} is not one of {self.PARAMETER_NAMES}.")
        if isinstance(pruning_fn, str):
            pruning_fn = self._named_fn(pruning_fn.lower(), pruning_dim, pruning_norm)
        elif _is_pruning_method(pruning_fn):
            if not use_global_unstructured:
                raise ConfigError(
                    "a BasePruningMethod class as pruning_fn needs use_global_unstructured=True."
                )
        elif not callable(pruning_fn) or isinstance(pruning_fn, pytorch_prune.BasePruningMethod):
            raise ConfigError(
                f"pruning_fn must be one of {list(_FUNCTIONS)} or a BasePruningMethod class (not an instance); "
                f"got {pruning_fn!r}."
            )
        if use_global_unstructured and getattr(pruning_fn, "PRUNING_TYPE", None) != "unstructured":
            raise ConfigError(
                f"use_global_unstructured=True works with unstructured pruning only; {pruning_fn} is not. "
                "Pass use_global_unstructured=False to prune layer by layer."
            )
        self.pruning_fn = pruning_fn
        self._apply_pruning = apply_pruning
        self._make_pruning_permanent = make_pruning_permanent
        if not (isinstance(amount, (int, float)) or callable(amount)):
            raise ConfigError(f"amount must be an int, a float or a function of the epoch, got {amount!r}.")
        self.amount = amount
        if verbose not in (0, 1, 2):
            raise ConfigError(f"verbose must be 0, 1 or 2, got {verbose!r}.")
        self._verbose = verbose

    def _named_fn(self, name: str, dim: int | None, norm: int | None) -> Any:
        if name not in _FUNCTIONS:
            raise ConfigError(f"pruning_fn {name!r} is not one of torch's: {list(_FUNCTIONS)}.")
        kwargs: dict[str, Any] = {}
        if name.endswith("_structured"):
            if dim is None:
                raise ConfigError(f"pruning_fn={name!r} (structured) needs pruning_dim.")
            if name == "ln_structured":
                if norm is None:
                    raise ConfigError("pruning_fn='ln_structured' needs pruning_norm.")
                kwargs["n"] = norm
            kwargs["dim"] = dim
        if self._use_global_unstructured:
            self._global_kwargs = kwargs
            self._pruning_method_name = _METHODS[name].__name__
            return _METHODS[name]
        self._pruning_method_name = _FUNCTIONS[name].__name__
        return partial(_FUNCTIONS[name], **kwargs)

    def filter_parameters_to_prune(self, parameters_to_prune: ParamList = ()) -> ParamList:
        """Override to choose which (module, name) pairs to prune."""
        return parameters_to_prune

    # ----- pruning ---------------------------------------------------------------------------------
    def make_pruning_permanent(self, module: nn.Module) -> None:
        """Remove the masks: each pruned parameter becomes its masked value."""
        for _, mod in module.named_modules():
            for k in list(mod._forward_pre_hooks):
                hook = mod._forward_pre_hooks[k]
                if isinstance(hook, pytorch_prune.BasePruningMethod):
                    hook.remove(mod)
                    del mod._forward_pre_hooks[k]

    @staticmethod
    def _copy_param(new: nn.Module, old: nn.Module, name: str) -> None:
        dst = getattr(new, name + "_orig") if hasattr(new, name + "_orig") else getattr(new, name)
        src = getattr(old, name)
        if isinstance(dst, Tensor) and isinstance(src, Tensor):
            # a copy: Lightning 2.6 shares the saved tensor, which training then changes in place, so that
            # its later resets are no-ops instead of going back to the weights from before training
            dst.data = src.data.to(dst.device, copy=True)

    def apply_lottery_ticket_hypothesis(self) -> None:
        """The unpruned weights go back to their values from before training (or fresh ones when resampling)."""
        assert self._original_layers is not None
        for ref in self._original_layers.values():
            copy = ref["data"]
            if self._resample_parameters and callable(getattr(copy, "reset_parameters", None)):
                copy = deepcopy(copy)
                copy.reset_parameters()
            for i, name in ref["names"]:
                self._copy_param(self._parameters_to_prune[i][0], copy, name)

    def _apply_global_pruning(self, amount: float) -> None:
        self._global_kwargs["amount"] = amount
        wanted = set(inspect.signature(self.pruning_fn).parameters) - {"self"}
        kwargs = {k: v for k, v in self._global_kwargs.items() if k in wanted}
        pytorch_prune.global_unstructured(self._parameters_to_prune, pruning_method=self.pruning_fn, **kwargs)

    @staticmethod
    def _get_pruned_stats(module: nn.Module, name: str) -> tuple[int, int]:
        mask = getattr(module, f"{name}_mask", None)
        return (0, 1) if mask is None else (int((mask == 0).sum().item()), mask.numel())

    def apply_pruning(self, amount: int | float) -> None:
        """Prune once by `amount`, globally or layer by layer."""
        before = [self._get_pruned_stats(m, n) for m, n in self._parameters_to_prune] if self._verbose else []
        if self._use_global_unstructured:
            self._apply_global_pruning(amount)
        else:
            for module, name in self._parameters_to_prune:
                self.pruning_fn(module, name=name, amount=amount)
        if self._verbose:
            after = [self._get_pruned_stats(m, n) for m, n in self._parameters_to_prune]
            total = sum(t for _, t in after)
            was, now = sum(z for z, _ in before), sum(z for z, _ in after)
            log.info(
                f"Applied `{self._pruning_method_name}`. Pruned: {was}/{total} ({was / total:.2%}) -> "
                f"{now}/{total} ({now / total:.2%})"
            )
        if self._verbose == 2:  # and each parameter's (Lightning's verbose=2)
            for (module, name), (z0, t), (z1, _) in zip(self._parameters_to_prune, before, after):
                log.info(
                    f"Applied `{self._pruning_method_name}` to `{module!r}.{name}` with amount={amount}. Pruned: "
                    f"{z0} ({z0 / t:.2%}) -> {z1} ({z1 / t:.2%})"
                )

    def _run_pruning(self, trainer: Trainer, epoch: int) -> None:
        prune = self._apply_pruning(epoch) if callable(self._apply_pruning) else self._apply_pruning
        amount = self.amount(epoch) if callable(self.amount) else self.amount
        if not prune or not amount:
            return
        self.apply_pruning(amount)
        lottery = self._use_lottery_ticket_hypothesis
        if lottery(epoch) if callable(lottery) else lottery:
            self.apply_lottery_ticket_hypothesis()
        self._agree(trainer)

    def _agree(self, trainer: Trainer) -> None:
        """Several processes: rank 0's masks and reset weights on every rank (random pruning draws on each
        rank's own generator), so that every rank trains the same pruned model."""
        comm = trainer.strategy.comm
        if comm.world_size == 1:
            return
        tensors = [
            t for m, n in self._parameters_to_prune for t in (getattr(m, n + "_orig", None), getattr(m, n + "_mask", None))
            if isinstance(t, Tensor)
        ]  # fmt: skip
        values = comm.broadcast([t.detach().cpu() for t in tensors] if comm.is_global_zero else None)
        for t, v in zip(tensors, values):
            t.data.copy_(v.to(t.device))

    # ----- hooks ---------------------------------------------------------------------------------
    def setup(self, trainer: Trainer, task: Task, stage: str) -> None:
        if trainer.strategy.name in ("fsdp", "model_parallel"):
            raise ConfigError(
                "ModelPruning replaces each pruned parameter by weight_orig * weight_mask (torch.nn.utils.prune), "
                f"which the sharded (DTensor) parameters of strategy={trainer.strategy.name!r} do not support; use "
                "strategy='ddp'."
            )
        params = self.sanitize_parameters_to_prune(task, self._parameters_to_prune, self._parameter_names)
        self._parameters_to_prune = self.filter_parameters_to_prune(params)
        if self._use_lottery_ticket_hypothesis:
            self._original_layers = {}
            for i, (module, name) in enumerate(self._parameters_to_prune):
                ref = self._original_layers.setdefault(id(module), {"data": deepcopy(module), "names": []})
                ref["names"].append((i, name))

    def on_train_epoch_end(self, trainer: Trainer, task: Task) -> None:
        if self._prune_on_train_epoch_end:
            self._run_pruning(trainer, task.current_epoch)

    def on_validation_epoch_end(self, trainer: Trainer, task: Task) -> None:
        if not trainer.sanity_checking and not self._prune_on_train_epoch_end:
            self._run_pruning(trainer, task.current_epoch)

    def on_train_end(self, trainer: Trainer, task: Task) -> None:
        if self._make_pruning_permanent:
            self.make_pruning_permanent(task)

    def on_save_checkpoint(self, trainer: Trainer, task: Task, checkpoint: dict[str, Any]) -> None:
        """With make_pruning_permanent, the checkpoint holds each pruned weight as its masked value."""
        if not self._make_pruning_permanent:
            return
        state = dict(task.state_dict())
        for name in {k[: -len("_mask")] for k in state if k.endswith("_mask")}:
            orig, mask = state.pop(name + "_orig"), state.pop(name + "_mask")
            state[name] = mask.to(dtype=orig.dtype) * orig
        checkpoint["state_dict"] = {k: v.cpu() for k, v in state.items()}

    @staticmethod
    def sanitize_parameters_to_prune(
        pl_module: nn.Module, parameters_to_prune: ParamList = (), parameter_names: Sequence[str] = ()
    ) -> ParamList:
        """Every (layer, name) to prune: the given pairs (checked to be in the task), or by default each of
        `parameter_names` that is a Parameter of a non-container layer."""
        names = parameter_names or ModelPruning.PARAMETER_NAMES
        containers = (nn.Sequential, nn.ModuleList, nn.ModuleDict)
        layers = [
            m
            for m in pl_module.modules()
            if m is not pl_module and not isinstance(m, containers) and not _is_task(m)
        ]
        if not parameters_to_prune:
            return [(m, p) for p in names for m in layers if isinstance(getattr(m, p, None), nn.Parameter)]
        pairs = list(parameters_to_prune) if isinstance(parameters_to_prune, (list, tuple)) else None
        if not pairs or not all(
            isinstance(p, (list, tuple))
            and len(p) == 2
            and isinstance(p[0], nn.Module)
            and isinstance(p[1], str)
            for p in pairs
        ):
            raise ConfigError(
                "parameters_to_prune must be a list of (nn.Module, parameter name) pairs, or empty."
            )
        missing_modules = [m for m, _ in pairs if m not in layers]
        missing_names = [n for m, n in pairs if m in layers and not hasattr(m, n)]
        if missing_modules or missing_names:
            raise ConfigError(
                f"some parameters_to_prune are not in the task: modules {missing_modules}, names {missing_names}."
            )
        return pairs


def _is_pruning_method(method: Any) -> bool:
    return inspect.isclass(method) and issubclass(method, pytorch_prune.BasePruningMethod)


def _is_task(module: nn.Module) -> bool:
    """A Task nested in the task (a container, as Lightning skips a LightningModule): it has the Task's steps."""
    return callable(getattr(module, "training_step", None)) and callable(
        getattr(module, "configure_optimizers", None)
    )
