"""PipelineStrategy's checks: its options, the task's pipeline hooks, and the batch size (a pipeline's receive
buffers are sized by its first step: a batch of another size must be refused before it runs, never computed on
stale buffers)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from tandem_core.errors import ConfigError, TaskError

if TYPE_CHECKING:
    from trainer.task.base import Task


def check_options(
    schedule: str,
    n_microbatches: int | None,
    stages_per_rank: int | None,
    data_parallel_size: int,
    known: Any,
) -> None:
    if schedule not in known:
        raise ConfigError(
            f"PipelineStrategy(schedule={schedule!r}): use one of {', '.join(map(repr, known))}."
        )
    if n_microbatches is not None and (not isinstance(n_microbatches, int) or n_microbatches < 1):
        raise ConfigError(f"PipelineStrategy(n_microbatches={n_microbatches!r}) must be a positive integer.")
    if stages_per_rank is not None:
        if not isinstance(stages_per_rank, int) or stages_per_rank < 1:
            raise ConfigError(
                f"PipelineStrategy(stages_per_rank={stages_per_rank!r}) must be a positive integer."
            )
        if schedule != "Interleaved1F1B" and stages_per_rank != 1:
            raise ConfigError(
                f"PipelineStrategy(schedule={schedule!r}) runs one stage per rank, but stages_per_rank="
                f"{stages_per_rank}; use schedule='Interleaved1F1B' for several stages per rank."
            )
        if schedule == "Interleaved1F1B" and stages_per_rank < 2:
            raise ConfigError(
                "PipelineStrategy(schedule='Interleaved1F1B') interleaves several stages per rank: "
                f"stages_per_rank must be at least 2, got {stages_per_rank}."
            )
    if not isinstance(data_parallel_size, int) or data_parallel_size < 1:
        raise ConfigError(
            f"PipelineStrategy(data_parallel_size={data_parallel_size!r}) must be a positive integer."
        )


def check_task(task: Task, n_stages: int, pp: int, per_rank: int) -> list[torch.nn.Module]:
    """The task's stages from configure_pipeline(), checked: as many as the pipeline has, distinct
    submodules of the task; and a pipeline_loss."""
    hook = getattr(task, "configure_pipeline", None)
    if hook is None:
        raise TaskError(
            f"{type(task).__name__} must define configure_pipeline() returning its model's stages in order (a "
            "list of its nn.Modules) to run under PipelineStrategy."
        )
    if not callable(getattr(task, "pipeline_loss", None)):
        raise TaskError(
            f"{type(task).__name__} must define pipeline_loss(output, target) -> the micro-batch's mean loss "
            "(the last stage's output against the batch's target) to run under PipelineStrategy."
        )
    modules = list(hook())
    if len(modules) != n_stages:
        raise ConfigError(
            f"{type(task).__name__}.configure_pipeline() returned {len(modules)} stages, but the pipeline has "
            f"{pp} rank(s) x stages_per_rank={per_rank} = {n_stages}; return {n_stages} stages, or change devices, "
            "data_parallel_size or stages_per_rank."
        )
    names = {id(p): n for n, p in task.named_parameters()}
    seen: dict[int, int] = {}
    for i, m in enumerate(modules):
        if not isinstance(m, torch.nn.Module):
            raise TaskError(f"configure_pipeline() stage {i} is {type(m).__name__}, not an nn.Module.")
        for p in m.parameters():
            if id(p) not in names:
                raise TaskError(
                    f"configure_pipeline() stage {i} holds a parameter of shape {tuple(p.shape)} that is not the "
                    "task's: build the stages from modules assigned in __init__ (e.g. "
                    "nn.Sequential(self.embed, *self.blocks[:2]))."
                )
            if seen.setdefault(id(p), i) != i:
                raise TaskError(
                    f"configure_pipeline(): parameter {names[id(p)]!r} is in stages {seen[id(p)]} and {i}; each "
                    "parameter must belong to one stage."
                )
    missing = [n for n, p in task.named_parameters() if id(p) not in seen]
    if missing:
        raise TaskError(
            f"configure_pipeline()'s stages leave out parameters of the task ({', '.join(missing[:5])}); put every "
            "module with parameters into a stage (or freeze and delete what the pipeline does not use)."
        )
    return modules


def check_loader(loader: Any, n_microbatches: int) -> None:
    """Before the first step: the loader's batches all have one size, divisible by n_microbatches."""
    size = getattr(loader, "batch_size", None)
    if size is None:  # a custom batch sampler: every batch is checked as it comes (check_batch)
        return
    if size % n_microbatches:
        raise ConfigError(
            f"PipelineStrategy: the training loader's batch_size={size} is not divisible by "
            f"n_microbatches={n_microbatches}; make batch_size a multiple of {n_microbatches}."
        )
    try:
        samples = len(loader.sampler)
    except TypeError:
        return
    rest = samples % size
    if rest and not loader.drop_last:
        raise ConfigError(
            f"PipelineStrategy: this rank's {samples} training samples make a last batch of {rest} (batch_size="
            f"{size}, n_microbatches={n_microbatches}); a pipeline's buffers are sized by its first batch, so every "
            "batch must have the same size: set drop_last=True on the DataLoader, or choose a batch_size that "
            "divides the samples per rank."
        )


def check_batch(x: torch.Tensor, first: int | None, n_microbatches: int) -> int:
    """This batch's size, checked before it runs: divisible by n_microbatches and equal to the first one's."""
    if not isinstance(x, torch.Tensor):
        raise TaskError(f"PipelineStrategy: the batch's input must be a tensor, got {type(x).__name__}.")
    size = x.shape[0]
    if size % n_microbatches:
        raise TaskError(
            f"PipelineStrategy: a batch of {size} samples cannot be split into n_microbatches={n_microbatches}; "
            "use a batch size divisible by it (and drop_last=True on the DataLoader)."
        )
    if first is not None and size != first:
        raise TaskError(
            f"PipelineStrategy: a batch of {size} samples after batches of {first} (n_microbatches="
            f"{n_microbatches}): the pipeline's buffers are sized by the first batch; set drop_last=True on the "
            "DataLoader so that every batch has the same size."
        )
    return size
