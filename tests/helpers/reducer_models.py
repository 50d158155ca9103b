"""Models, batches and one-step helpers of the Reducer tests (our Reducer and torch DDP side by side)."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from strategies.reducer import Reducer

VOCAB, TOKENS, BATCH = 16, 5, 6  # BATCH rows per rank
K = 3  # micro-batches per accumulation window
CAP_MB = 0.0003  # ~300-byte buckets: many buckets on these tiny models


class Mixed(nn.Module):
    """Many small params, a float64 param, tied weights, a frozen layer, a layer used twice."""

    def __init__(self) -> None:
        super().__init__()
        self.late = nn.Linear(8, 8)  # defined first, used last: the rebuild must reorder buckets
        self.embed = nn.Embedding(VOCAB, 8)
        self.blocks = nn.ModuleList(nn.Linear(8, 8) for _ in range(5))
        self.frozen = nn.Linear(8, 8).requires_grad_(False)
        self.twice = nn.Linear(8, 8)
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, 8, dtype=torch.float64))
        self.head = nn.Linear(8, VOCAB, bias=False)
        self.head.weight = self.embed.weight  # tied

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens).mean(1)
        for block in self.blocks:
            h = torch.tanh(block(h))
        h = self.twice(torch.relu(self.twice(self.frozen(h))))
        h = (h.double() * self.scale).float()
        return self.head(torch.tanh(self.late(h)))


class WithBatchNorm(nn.Module):
    """A model whose BatchNorm running stats differ per rank unless broadcast."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(VOCAB, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, VOCAB))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.net(F.one_hot(tokens, VOCAB).float().mean(1))


class Branchy(nn.Module):
    """`unused` never runs; `sometimes` runs only when asked (on rank 0 in the tests)."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.unused, self.sometimes, self.out = (nn.Linear(8, 8) for _ in range(4))

    def forward(self, x: torch.Tensor, use_sometimes: bool) -> torch.Tensor:
        h = torch.relu(self.first(x))
        return self.out(h + self.sometimes(h) if use_sometimes else h)


def make(cls: type[nn.Module], seed: int = 0) -> nn.Module:
    """cls() built after seeding, so that every copy starts from the same weights."""
    torch.manual_seed(seed)
    return cls()


def batch(step: int, rank: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of `step`, or rank's half of it (rank=None: all of it)."""
    g = torch.Generator().manual_seed(100 + step)
    x = torch.randint(0, VOCAB, (2 * BATCH, TOKENS), generator=g)
    y = torch.randint(0, VOCAB, (2 * BATCH,), generator=g)
    if rank is None:
        return x, y
    return x[rank * BATCH : (rank + 1) * BATCH], y[rank * BATCH : (rank + 1) * BATCH]


def grads(model: nn.Module) -> dict[str, torch.Tensor | None]:
    """A copy of every parameter's gradient (None where it has none), by name."""
    return {n: None if p.grad is None else p.grad.detach().clone() for n, p in model.named_parameters()}


def ours_step(
    model: nn.Module, reducer: Reducer, opt: torch.optim.Optimizer, *inputs: object, give_loss: bool = True
) -> dict:
    """One synchronised step through the Reducer, returning the reduced grads."""
    x, y = inputs[0], inputs[1]
    opt.zero_grad(set_to_none=True)
    reducer.sync_buffers()
    loss = F.cross_entropy(model(x, *inputs[2:]), y)
    reducer.prepare_for_backward(loss if give_loss else None)
    loss.backward()
    reducer.finalize()
    result = grads(model)
    opt.step()
    return result


def ddp_step(ddp: DDP, opt: torch.optim.Optimizer, *inputs: object) -> dict:
    """One step through torch DDP, returning the reduced grads."""
    x, y = inputs[0], inputs[1]
    opt.zero_grad(set_to_none=True)
    F.cross_entropy(ddp(x, *inputs[2:]), y).backward()
    result = grads(ddp.module)
    opt.step()
    return result


def gathered(obj: object) -> list[object]:
    """obj of every rank, in rank order."""
    out: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def assert_grads_close(a: dict, b: dict, atol: float = 1e-6, rtol: float = 0.0, what: str = "") -> None:
    """The same names, None in the same places, and close tensors elsewhere."""
    assert a.keys() == b.keys()
    for name in a:
        if a[name] is None or b[name] is None:
            assert a[name] is None and b[name] is None, f"{what} {name}: {a[name]} vs {b[name]}"
        else:
            torch.testing.assert_close(
                a[name], b[name], atol=atol, rtol=rtol, msg=lambda m, name=name: f"{what} {name}: {m}"
            )
