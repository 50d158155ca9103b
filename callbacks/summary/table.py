"""The model summary's data (Lightning's columns: name, type, parameters, mode, FLOPs, in/out sizes) and its
text table. FLOPs and sizes come from one forward of the task's ``example_input_array``, counted by
``torch.utils.flop_counter.FlopCounterMode``; without an example input they are 0 and absent."""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

UNKNOWN_SIZE = "?"
NOT_APPLICABLE = "n/a"


def human_count(number: int | float) -> str:
    """1234 -> '1.2 K', 123 -> '123  ': Lightning's abbreviation with K, M, B, T."""
    labels = [" ", "K", "M", "B", "T"]
    digits = int(math.floor(math.log10(number)) + 1) if number > 0 else 1
    groups = min(int(math.ceil(digits / 3)), len(labels))
    value = number * 10 ** (-3 * (groups - 1))
    if groups - 1 < 1 or value >= 100:
        return f"{int(value):,d} {labels[groups - 1]}"
    return f"{value:,.1f} {labels[groups - 1]}"


def _numel(p: torch.Tensor) -> int:
    return 0 if isinstance(p, torch.nn.parameter.UninitializedParameter) else p.numel()


def _shape(x: Any) -> Any:
    if hasattr(x, "shape"):
        return list(x.shape)
    if isinstance(x, (list, tuple)):
        return [_shape(e) for e in x]
    return UNKNOWN_SIZE


@dataclass
class Summary:
    """Per-layer columns and the totals of a module (``summarize(task).columns``)."""

    columns: list[tuple[str, list[str]]]
    total_parameters: int
    trainable_parameters: int
    model_size: float  # MB at the run's precision
    total_training_modes: dict[str, int]
    total_flops: int = 0
    sizes: dict[str, tuple[Any, Any]] = field(default_factory=dict)  # layer -> (in size, out size)
    # per layer, in order (Lightning's ModelSummary reads them): name, class name, parameters, in train mode
    layer_names: list[str] = field(default_factory=list)
    layer_types: list[str] = field(default_factory=list)
    param_nums: list[int] = field(default_factory=list)
    training_modes: list[bool] = field(default_factory=list)

    @property
    def in_sizes(self) -> list[Any]:
        """Each layer's input size in the example's forward (UNKNOWN_SIZE where it did not run)."""
        return [self.sizes.get(n, (UNKNOWN_SIZE, UNKNOWN_SIZE))[0] or UNKNOWN_SIZE for n in self.layer_names]

    @property
    def out_sizes(self) -> list[Any]:
        """Each layer's output size in the example's forward (UNKNOWN_SIZE where it did not run)."""
        return [self.sizes.get(n, (UNKNOWN_SIZE, UNKNOWN_SIZE))[1] or UNKNOWN_SIZE for n in self.layer_names]

    @property
    def total_layer_params(self) -> int:
        """The parameters the listed layers hold (shared ones counted in each)."""
        return sum(self.param_nums)

    def __str__(self) -> str:
        return format_table(self)


def _layers(module: torch.nn.Module, max_depth: int) -> list[tuple[str, torch.nn.Module]]:
    if max_depth == 0:
        return []
    if max_depth == 1:
        return list(module.named_children())
    mods = list(module.named_modules())[1:]
    return [(n, m) for n, m in mods if max_depth == -1 or n.count(".") < max_depth]


def summarize(module: torch.nn.Module, max_depth: int = 1, precision_bits: int = 32) -> Summary:
    """The summary of `module` down to `max_depth` (-1: every layer); a Task's example_input_array, when
    set, is run through it once (eval mode, no gradients) for the FLOPs and the in/out sizes."""
    if not isinstance(max_depth, int) or max_depth < -1:
        raise ValueError(f"max_depth can be -1, 0 or > 0, got {max_depth!r}.")
    layers = _layers(module, max_depth)
    example = getattr(module, "example_input_array", None)
    sizes: dict[str, tuple[Any, Any]] = {}
    flops: dict[str, int] = {}
    total_flops = 0
    if example is not None:
        sizes, flops, total_flops = _forward_example(module, example, layers, max_depth)
    unique = {id(p): p for p in module.parameters()}.values()  # shared parameters count once
    total = sum(_numel(p) for p in unique)
    trainable = sum(_numel(p) for p in unique if p.requires_grad)
    counts = [sum(_numel(p) for p in m.parameters()) for _, m in layers]
    columns: list[tuple[str, list[str]]] = [
        (" ", [str(i) for i in range(len(layers))]),
        ("Name", [n for n, _ in layers]),
        ("Type", [type(m).__name__ for _, m in layers]),
        ("Params", [human_count(c) for c in counts]),
        ("Mode", ["train" if m.training else "eval" for _, m in layers]),
        ("FLOPs", [human_count(flops.get(n, 0)) for n, _ in layers]),
    ]
    if example is not None:
        unknown = (UNKNOWN_SIZE, UNKNOWN_SIZE)  # (an empty size, of no input, is unknown too)
        columns.append(("In sizes", [str(sizes.get(n, unknown)[0] or UNKNOWN_SIZE) for n, _ in layers]))
        columns.append(("Out sizes", [str(sizes.get(n, unknown)[1] or UNKNOWN_SIZE) for n, _ in layers]))
    leftover = total - sum(counts)
    if leftover > 0:  # parameters held by the module itself, not by a child
        extra = {" ": " ", "Name": "other params", "Params": human_count(leftover)}
        for name, values in columns:
            values.append(extra.get(name, NOT_APPLICABLE))
    modes = [m.training for m in module.modules()][1:]
    return Summary(
        columns, total, trainable, total * precision_bits / 8 * 1e-6,
        {"train": modes.count(True), "eval": modes.count(False)}, total_flops, sizes,
        [n for n, _ in layers], [type(m).__name__ for _, m in layers], counts, [m.training for _, m in layers],
    )  # fmt: skip


def _forward_example(
    module: torch.nn.Module, example: Any, layers: list[tuple[str, torch.nn.Module]], max_depth: int
) -> tuple[dict[str, tuple[Any, Any]], dict[str, int], int]:
    sizes: dict[str, tuple[Any, Any]] = {}

    def recorder(name: str) -> Any:
        def hook(_: Any, args: tuple, kwargs: dict, out: Any) -> None:
            inp = (*args, *kwargs.values())
            sizes.setdefault(name, (_shape(inp[0] if len(inp) == 1 else inp), _shape(out)))

        return hook

    handles = [  # (a TorchScript module takes no hooks: its sizes stay unknown)
        m.register_forward_hook(recorder(n), with_kwargs=True)
        for n, m in layers
        if not isinstance(m, torch.jit.ScriptModule)
    ]
    counter = FlopCounterMode(display=False, depth=max_depth + 1 if max_depth != -1 else 999)
    trainer = getattr(module, "_trainer", None)
    autocast = trainer.strategy.autocast() if trainer is not None else contextlib.nullcontext()
    modes = {m: m.training for m in module.modules()}
    try:
        batch = _to_device(module, example)
        module.eval()
        with torch.no_grad(), autocast, counter:
            if isinstance(batch, (list, tuple)):
                module(*batch)
            elif isinstance(batch, dict):
                module(**batch)
            else:
                module(batch)
    finally:
        for h in handles:
            h.remove()
        for m, mode in modes.items():
            m.training = mode
    counts = counter.get_flop_counts()
    prefix = type(module).__name__
    flops = {n: sum(counts.get(f"{prefix}.{n}", {}).values()) for n, _ in layers}
    return sizes, flops, counter.get_total_flops()


def _to_device(module: torch.nn.Module, batch: Any) -> Any:
    """The example through a Task's batch-transfer hooks (as a training batch goes), else moved as is."""
    from strategies.batch import move_to_device

    device = next(module.parameters(), torch.empty(0)).device
    if not hasattr(module, "transfer_batch_to_device"):
        return move_to_device(batch, device)
    batch = module.on_before_batch_transfer(batch, 0)  # type: ignore[operator]
    batch = module.transfer_batch_to_device(batch, device, 0)  # type: ignore[operator]
    return module.on_after_batch_transfer(batch, 0)  # type: ignore[operator]


def format_table(s: Summary) -> str:
    """Lightning's text table: the columns, a rule, then the totals."""
    n = len(s.columns[0][1])
    widths = [max([len(name), *(len(v) for v in values)]) for name, values in s.columns]
    total_width = sum(widths) + 3 * (len(s.columns) + 1)
    lines = [" | ".join(f"{name:<{w}}" for (name, _), w in zip(s.columns, widths)), "-" * total_width]
    for i in range(n):
        lines.append(" | ".join(f"{values[i]:<{w}}" for (_, values), w in zip(s.columns, widths)))
    lines.append("-" * total_width)
    totals = [
        (human_count(s.trainable_parameters), "Trainable params"),
        (human_count(s.total_parameters - s.trainable_parameters), "Non-trainable params"),
        (human_count(s.total_parameters), "Total params"),
        (f"{s.model_size:,.3f}", "Total estimated model params size (MB)"),
        (str(s.total_training_modes["train"]), "Modules in train mode"),
        (str(s.total_training_modes["eval"]), "Modules in eval mode"),
        (human_count(s.total_flops), "Total Flops"),
    ]
    lines += [f"{value:<10}{label}" for value, label in totals]
    return "\n".join(lines)
