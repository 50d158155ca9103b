"""Lightning's model-summary utility by its names (``lightning.pytorch.utilities.model_summary``): a
``ModelSummary(model, max_depth)`` object with the per-layer lists (``layer_names``, ``layer_types``, ``param_nums``,
``in_sizes``, ``out_sizes``, ``training_modes``) and totals, printed as the ModelSummary callback's table. The
figures are table.py's (one forward of ``example_input_array`` for sizes and FLOPs)."""

from __future__ import annotations

import warnings
from typing import Any

import torch

from callbacks.summary.table import NOT_APPLICABLE, UNKNOWN_SIZE, Summary, _shape, human_count
from callbacks.summary.table import summarize as summary_of

LEFTOVER_PARAMS_NAME = "other params"
_BITS = {"64-true": 64, "32-true": 32, "16-true": 16, "bf16-true": 16}

__all__ = [
    "LEFTOVER_PARAMS_NAME",
    "NOT_APPLICABLE",
    "UNKNOWN_SIZE",
    "ModelSummary",
    "get_formatted_model_size",
    "get_human_readable_count",
    "parse_batch_shape",
    "summarize",
]


class ModelSummary(Summary):
    """The summary of `model` down to `max_depth` (-1: every layer, 0: none). Example::

    summary = ModelSummary(task, max_depth=-1)
    summary.param_nums, summary.total_parameters, print(summary)
    """

    def __init__(self, model: torch.nn.Module, max_depth: int = 1) -> None:
        if not isinstance(max_depth, int) or isinstance(max_depth, bool) or max_depth < -1:
            raise ValueError(f"`max_depth` can be -1, 0 or > 0, got {max_depth!r}")
        self._model, self._max_depth, self._bits = model, max_depth, _precision_bits(model)
        summary = summary_of(model, max_depth, self._bits)
        self.__dict__.update(summary.__dict__)

    # the totals are read from the model when asked (a layer switched to eval later counts as eval), as Lightning's
    @property  # type: ignore[override]
    def total_parameters(self) -> int:
        """Every parameter of the model once (a lazy layer's, not yet materialized, count 0, with a warning)."""
        return sum(_count(p) for p in _unique(self._model))

    @total_parameters.setter
    def total_parameters(self, _: int) -> None:  # (the dataclass's field, set by __init__)
        return

    @property  # type: ignore[override]
    def trainable_parameters(self) -> int:
        """The parameters that require gradients."""
        return sum(p.numel() for p in _unique(self._model) if p.requires_grad and not _lazy(p))

    @trainable_parameters.setter
    def trainable_parameters(self, _: int) -> None:
        return

    @property  # type: ignore[override]
    def model_size(self) -> float:
        """Megabytes of the parameters at the run's precision (32 bits without a run)."""
        return self.total_parameters * self._bits / 8 * 1e-6

    @model_size.setter
    def model_size(self, _: float) -> None:
        return

    @property  # type: ignore[override]
    def total_training_modes(self) -> dict[str, int]:
        """How many modules (the root excluded) are in train and in eval mode now."""
        modes = [m.training for m in self._model.modules()][1:]
        return {"train": modes.count(True), "eval": modes.count(False)}

    @total_training_modes.setter
    def total_training_modes(self, _: dict[str, int]) -> None:
        return

    @property
    def max_depth(self) -> int:
        """How deep the listed layers go (-1: every layer)."""
        return self._max_depth

    @property
    def named_modules(self) -> list[tuple[str, torch.nn.Module]]:
        """The listed layers with their names."""
        modules = dict(self._model.named_modules())
        return [(name, modules[name]) for name in self.layer_names]


def _precision_bits(model: torch.nn.Module) -> int:
    """The bits per parameter of the run the model is attached to (32 without one; under mixed precision 32,
    with a warning that the size is an estimate)."""
    trainer = getattr(model, "_trainer", None)
    precision = getattr(getattr(trainer, "strategy", None), "precision", None)
    name = getattr(precision, "name", "32-true")
    if name not in _BITS:
        warnings.warn(
            f"Precision {name} is not supported by the model summary: the parameters' size is estimated at 32 "
            "bits each",
            UserWarning,
            stacklevel=3,
        )
    return _BITS.get(name, 32)


def _unique(model: torch.nn.Module) -> list[torch.Tensor]:
    return list({id(p): p for p in model.parameters()}.values())  # shared parameters count once


def _lazy(p: torch.Tensor) -> bool:
    return isinstance(p, torch.nn.parameter.UninitializedParameter)


def _count(p: torch.Tensor) -> int:
    if _lazy(p):
        warnings.warn(
            "The total number of parameters detected may be inaccurate: the model has a lazy layer whose "
            "parameters are not materialized yet (UninitializedParameter); set example_input_array on the task",
            UserWarning,
            stacklevel=3,
        )
        return 0
    return p.numel()


def summarize(lightning_module: torch.nn.Module, max_depth: int = 1) -> ModelSummary:
    """Lightning's ``summarize(model, max_depth)``: a ModelSummary."""
    return ModelSummary(lightning_module, max_depth)


def get_human_readable_count(number: int) -> str:
    """1234 -> '1.2 K', 123 -> '123  ' (K, M, B, T)."""
    return human_count(number)


def get_formatted_model_size(total_model_size: float) -> str:
    """A size in MB with three decimals."""
    return f"{total_model_size:,.3f}"


def parse_batch_shape(batch: Any) -> Any:
    """The shape of a tensor (nested for lists and tuples), UNKNOWN_SIZE for anything else."""
    return _shape(batch)
