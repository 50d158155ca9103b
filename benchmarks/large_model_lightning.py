"""benchmarks/large_model.py's GPT as a Lightning 2.x LightningModule: the same blocks (tests/helpers/plan_models.py),
the same loss and optimizer, the same tensor-parallel and FSDP plan in configure_model."""

from __future__ import annotations

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import nn

from tests.helpers.plan_models import Block


class LightningGPT(pl.LightningModule):
    def __init__(self, d: int, heads: int, layers: int, vocab: int) -> None:
        super().__init__()
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
        return F.cross_entropy(self(x).flatten(0, 1), y.flatten())

    def configure_model(self) -> None:
        mesh = getattr(self, "device_mesh", None)
        if mesh is None:  # (ddp)
            return
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        plan = {"attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel(),
                "attn.o": RowwiseParallel(), "up": ColwiseParallel(), "down": RowwiseParallel()}  # fmt: skip
        dp, tp = mesh["data_parallel"], mesh["tensor_parallel"]
        for block in self.blocks:
            if tp.size() > 1:
                parallelize_module(block, tp, plan)
            if dp.size() > 1:
                fully_shard(block, mesh=dp)
        if dp.size() > 1:
            fully_shard(self, mesh=dp)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)
