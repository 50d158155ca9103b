"""Evaluation under PipelineStrategy: validation, test and predict steps run through the stages, forward only.

While an evaluation step runs, the task's forward (``self(x)``) is the pipeline's (`forward`): the batch is cut
into micro-batches (n_microbatches, fewer for a small batch; one whole batch under pipeline x FSDP, whose
gathers need the same calls on every data-parallel rank), each goes through the stages in order, passed from
rank to rank point to point with a small header giving the shapes and dtypes (evaluation batches may have any
size, unlike the training schedule's fixed receive buffers), and the last stage's output is broadcast to every
rank of the pipeline. The rest of the step (its loss, metrics, ``self.log``, the prediction it returns) then
runs alike on every rank. A rank processes its stages micro-batch by micro-batch in stage order, sending
without waiting, so the stages work on different micro-batches at once and no rank waits on one that waits
on it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from tandem_core.errors import TaskError

if TYPE_CHECKING:
    from strategies.pipeline import PipelineStrategy

_DTYPES = [
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
    torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128,
]  # fmt: skip


def forward(strategy: PipelineStrategy, *args: Any) -> Any:
    """The whole model's forward of `args` (the first stage's inputs) through every stage; the last stage's
    output on every rank of this pipeline. Every rank of the pipeline calls it with the same batch."""
    mesh = strategy.device_mesh
    assert mesh is not None
    group, pp, last = mesh["pp"].get_group(), strategy.pipeline_parallel_size, strategy.n_stages - 1
    me = dist.get_rank()

    def holder(stage: int) -> int:
        return dist.get_global_rank(group, stage % pp)

    batch = next((a.shape[0] for a in args if isinstance(a, torch.Tensor) and a.dim() > 0), 1)
    k = 1 if strategy.data_parallel_size > 1 else max(1, min(strategy.n_microbatches, batch))
    chunks = _split(args, batch, k)
    outputs: list[Any] = []
    sends: list[tuple[Any, torch.Tensor]] = []  # (work, the tensor it sends: kept alive until waited)
    for chunk in chunks:
        carried: tuple[Any, ...] | None = None
        for stage in sorted(strategy.stage_indices):
            if stage == 0:
                inputs = chunk
            elif carried is not None:
                inputs = carried
            else:
                inputs = _recv(holder(stage - 1), group, strategy.root_device)
            out = strategy.stage_modules[stage](*inputs)
            if stage == last:
                outputs.append(out)
                carried = None
            elif holder(stage + 1) == me:
                carried = _as_tuple(out)
            else:
                sends += _send(_as_tuple(out), holder(stage + 1), group)
                carried = None
    for work, _ in sends:
        work.wait()
    result = _cat(outputs) if last in strategy.stage_indices else None
    return _broadcast(result, holder(last), group, strategy.root_device)


def meta_error(hook: str, e: BaseException) -> TaskError | None:
    """The error for a step that used a module of another rank's stage (on the meta device here), or None."""
    if "meta" not in str(e):
        return None
    return TaskError(
        f"{hook} under PipelineStrategy used a module this rank does not hold ({type(e).__name__}: {e}); each "
        "rank holds only its stages (the others are on the meta device). Call the task's forward, self(x), "
        "which runs x through every stage and returns the last stage's output, instead of its modules."
    )


def _as_tuple(out: Any) -> tuple[torch.Tensor, ...]:
    if isinstance(out, torch.Tensor):
        return (out,)
    if isinstance(out, (tuple, list)) and all(isinstance(t, torch.Tensor) for t in out):
        return tuple(out)
    raise TaskError(
        f"a pipeline stage returned {type(out).__name__}; a stage's output (the next stage's input) must be a "
        "tensor or a tuple of tensors."
    )


def _split(args: tuple[Any, ...], batch: int, k: int) -> list[tuple[Any, ...]]:
    """`args` cut into `k` micro-batches along dim 0 (tensors of the batch's length; others go whole)."""
    if k == 1:
        return [args]
    parts = [
        torch.tensor_split(a, k)
        if isinstance(a, torch.Tensor) and a.dim() and a.shape[0] == batch
        else [a] * k
        for a in args
    ]
    return [tuple(p[i] for p in parts) for i in range(k)]


def _cat(outputs: list[Any]) -> Any:
    if len(outputs) == 1:
        return outputs[0]
    if isinstance(outputs[0], torch.Tensor):
        return torch.cat(outputs)
    return type(outputs[0])(torch.cat(parts) for parts in zip(*outputs))


def _header(tensors: tuple[torch.Tensor, ...], is_tuple: bool) -> torch.Tensor:
    fields = [len(tensors), int(is_tuple)]
    for t in tensors:
        fields += [_DTYPES.index(t.dtype), t.dim(), *t.shape]
    return torch.tensor(fields, dtype=torch.int64)


def _parse(header: list[int]) -> tuple[list[tuple[torch.dtype, list[int]]], bool]:
    n, is_tuple, pos, specs = header[0], bool(header[1]), 2, []
    for _ in range(n):
        dtype, ndim = _DTYPES[header[pos]], header[pos + 1]
        specs.append((dtype, header[pos + 2 : pos + 2 + ndim]))
        pos += 2 + ndim
    return specs, is_tuple


def _send(tensors: tuple[torch.Tensor, ...], dst: int, group: Any) -> list[tuple[Any, torch.Tensor]]:
    """Non-blocking sends of a header (its length first) and the tensors; the caller waits on the works."""
    header = _header(tensors, True)
    device = tensors[0].device
    msgs = [torch.tensor([header.numel()], dtype=torch.int64, device=device), header.to(device)]
    msgs += [t.detach().contiguous() for t in tensors]
    return [(dist.isend(m, dst=dst, group=group), m) for m in msgs]


def _recv(src: int, group: Any, device: torch.device) -> tuple[torch.Tensor, ...]:
    size = torch.empty(1, dtype=torch.int64, device=device)
    dist.recv(size, src=src, group=group)
    header = torch.empty(int(size.item()), dtype=torch.int64, device=device)
    dist.recv(header, src=src, group=group)
    specs, _ = _parse(header.tolist())
    out = []
    for dtype, shape in specs:
        t = torch.empty(shape, dtype=dtype, device=device)
        dist.recv(t, src=src, group=group)
        out.append(t)
    return tuple(out)


def _broadcast(result: Any, src: int, group: Any, device: torch.device) -> Any:
    """The last stage's output (a tensor or a tuple of tensors) from `src` to every rank of `group`."""
    if dist.get_rank() == src:
        tensors = _as_tuple(result)
        header = _header(tensors, not isinstance(result, torch.Tensor)).to(device)
        size = torch.tensor([header.numel()], dtype=torch.int64, device=device)
    else:
        size = torch.empty(1, dtype=torch.int64, device=device)
    dist.broadcast(size, src=src, group=group)
    if dist.get_rank() != src:
        header = torch.empty(int(size.item()), dtype=torch.int64, device=device)
    dist.broadcast(header, src=src, group=group)
    specs, is_tuple = _parse(header.tolist())
    if dist.get_rank() != src:
        tensors = tuple(torch.empty(shape, dtype=dtype, device=device) for dtype, shape in specs)
    else:
        tensors = tuple(t.contiguous() for t in tensors)
    for t in tensors:
        dist.broadcast(t, src=src, group=group)
    return tensors if is_tuple else tensors[0]
