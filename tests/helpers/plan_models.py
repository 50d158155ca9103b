"""Two models that run under every strategy (ddp, ddp_zero1, fsdp, model_parallel, pipeline), for the memory
plan's tests and benchmarks/large_model.py: a GPT-style transformer and a deep MLP. Each has a tensor-parallel
plan (configure_model, used only under model_parallel) and a split into pipeline stages (configure_pipeline)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from trainer import Task


class Attention(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.head_dim = d // heads
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.q(x), self.k(x), self.v(x)  # under TP: this rank's heads only
        b, t, width = q.shape
        q, k, v = (z.reshape(b, t, width // self.head_dim, self.head_dim).transpose(1, 2) for z in (q, k, v))
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(self.head_dim), dim=-1)
        return self.o((att @ v).transpose(1, 2).reshape(b, t, width))


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(d), Attention(d, heads)
        self.norm2, self.up, self.down = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class GPT(Task):
    """Token embedding, `layers` pre-norm blocks, a final norm and an untied head; next-token cross entropy."""

    def __init__(
        self, d: int = 128, heads: int = 4, layers: int = 4, vocab: int = 1000, lr: float = 1e-3,
        seq: int = 64, batch_size: int = 8,
    ) -> None:  # fmt: skip
        super().__init__()
        self.lr, self.vocab, self.seq, self.batch_size = lr, vocab, seq, batch_size
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return self.pipeline_loss(self(x), y)

    def pipeline_loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(output.flatten(0, 1), target.flatten())

    def configure_model(self) -> None:
        mesh = self.device_mesh
        if mesh is None or "tensor_parallel" not in (mesh.mesh_dim_names or ()):
            return  # (only model_parallel splits it here)
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        plan = {"attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel(),
                "attn.o": RowwiseParallel(), "up": ColwiseParallel(), "down": RowwiseParallel()}  # fmt: skip
        dp = mesh["data_parallel"]
        for block in self.blocks:
            parallelize_module(block, mesh["tensor_parallel"], plan)
            if dp.size() > 1:
                fully_shard(block, mesh=dp)
        if dp.size() > 1:
            fully_shard(self, mesh=dp)

    def configure_pipeline(self) -> list[nn.Module]:
        n = self.trainer.strategy.n_stages
        per = [len(self.blocks) // n + (i < len(self.blocks) % n) for i in range(n)]
        stages, start = [], 0
        for i, k in enumerate(per):
            parts: list[nn.Module] = [self.embed] if i == 0 else []
            parts += list(self.blocks[start : start + k])
            parts += [self.norm, self.head] if i == n - 1 else []
            stages.append(_Stage(parts))
            start += k
        return stages

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.lr)

    def train_dataloader(self):
        from torch.utils.data import DataLoader, TensorDataset

        g = torch.Generator().manual_seed(0)
        x = torch.randint(0, self.vocab, (self.batch_size * 4, self.seq), generator=g)
        return DataLoader(TensorDataset(x, torch.roll(x, -1, dims=1)), batch_size=self.batch_size)


class _Stage(nn.Module):
    def __init__(self, parts: list[nn.Module]) -> None:
        super().__init__()
        self.parts = nn.ModuleList(parts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for part in self.parts:
            x = part(x)
        return x


class MLP(Task):
    """`layers` pairs of (width -> 4 width -> width) with residuals, on vectors; classification."""

    def __init__(self, width: int = 256, layers: int = 4, classes: int = 10) -> None:
        super().__init__()
        self.inp = nn.Linear(32, width)
        self.ups = nn.ModuleList(nn.Linear(width, 4 * width) for _ in range(layers))
        self.downs = nn.ModuleList(nn.Linear(4 * width, width) for _ in range(layers))
        self.out = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for up, down in zip(self.ups, self.downs):
            h = h + down(torch.relu(up(h)))
        return self.out(h)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return self.pipeline_loss(self(x), y)

    def pipeline_loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(output, target)

    def configure_model(self) -> None:
        mesh = self.device_mesh
        if mesh is None or "tensor_parallel" not in (mesh.mesh_dim_names or ()):
            return
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        plan = {f"ups.{i}": ColwiseParallel() for i in range(len(self.ups))}
        plan.update({f"downs.{i}": RowwiseParallel() for i in range(len(self.downs))})
        parallelize_module(self, mesh["tensor_parallel"], plan)
        if mesh["data_parallel"].size() > 1:
            fully_shard(self, mesh=mesh["data_parallel"])

    def configure_pipeline(self) -> list[nn.Module]:
        n = self.trainer.strategy.n_stages
        pairs = [_Pair(u, d) for u, d in zip(self.ups, self.downs)]
        per = [len(pairs) // n + (i < len(pairs) % n) for i in range(n)]
        stages, start = [], 0
        for i, k in enumerate(per):
            parts: list[nn.Module] = [self.inp] if i == 0 else []
            parts += pairs[start : start + k]
            parts += [self.out] if i == n - 1 else []
            stages.append(_Stage(parts))
            start += k
        return stages

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


class _Pair(nn.Module):
    def __init__(self, up: nn.Linear, down: nn.Linear) -> None:
        super().__init__()
        self.up, self.down = up, down

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.down(torch.relu(self.up(h)))
