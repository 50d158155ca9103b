"""The model-parallel tests' models, data and one-process reference, and a user's script for the
kill-and-restart test:

python mp_train.py OUT ROOT [--kill-rank R --kill-step S]

plain (Tandem starts 2 workers) or under torchrun; a (dp=1, tp=2) mesh; checkpoints to ROOT/ckpts every 2
steps; resume="auto". Rank 0 saves the final full weights and the step training started at to OUT.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from callbacks import Callback, ModelCheckpoint  # noqa: E402
from strategies.model_parallel import ModelParallelStrategy  # noqa: E402
from trainer import Task, Trainer  # noqa: E402

D, T, HEADS, HIDDEN, CLASSES, N = 16, 8, 4, 32, 8, 48


class Attention(nn.Module):
    """Multi-head self-attention from plain Linear layers; under TP q/k/v are column-split (each rank gets
    whole heads) and the attention itself runs on local tensors (no DTensor SDPA rule on CPU)."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(D, D) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.q(x), self.k(x), self.v(x)  # local: (B, T, D / tp)
        b, t, width = q.shape
        hd = D // HEADS
        q, k, v = (z.reshape(b, t, width // hd, hd).transpose(1, 2) for z in (q, k, v))
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd), dim=-1)
        return self.o((att @ v).transpose(1, 2).reshape(b, t, width))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.attn, self.norm2 = nn.LayerNorm(D), Attention(), nn.LayerNorm(D)
        self.mlp = nn.Sequential(nn.Linear(D, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, D))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Net(nn.Module):
    """kind "transformer": a pre-norm block with SequenceParallel norms; "mlp": two TP layers and a head
    that TP leaves whole (a plain parameter next to DTensors)."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        if kind == "transformer":
            self.inp, self.block, self.head = nn.Linear(D, D), Block(), nn.Linear(D, CLASSES)
        else:
            self.fc1, self.fc2, self.head = nn.Linear(D, HIDDEN), nn.Linear(HIDDEN, D), nn.Linear(D, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "transformer":
            return self.head(self.block(self.inp(x)))
        return self.head(torch.tanh(self.fc2(torch.relu(self.fc1(x)))))


def parallelize(net: Net, mesh, loss_parallel: bool = False, fsdp: bool = True) -> None:
    """TP on mesh["tensor_parallel"], then (`fsdp`) FSDP on mesh["data_parallel"] when it has more than one
    rank."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    tp, dp = mesh["tensor_parallel"], mesh["data_parallel"]
    if net.kind == "transformer":
        to_full = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
        plan = {
            "inp": ColwiseParallel(output_layouts=Shard(1)),  # sequence-sharded activations from here
            "block.norm1": SequenceParallel(),
            "block.attn": to_full,
            "block.attn.q": ColwiseParallel(),
            "block.attn.k": ColwiseParallel(),
            "block.attn.v": ColwiseParallel(),
            "block.attn.o": RowwiseParallel(output_layouts=Shard(1)),
            "block.norm2": SequenceParallel(),
            "block.mlp": to_full,
            "block.mlp.0": ColwiseParallel(),
            "block.mlp.2": RowwiseParallel(output_layouts=Shard(1)),
            "head": ColwiseParallel(input_layouts=Shard(1), use_local_output=not loss_parallel)
            if loss_parallel
            else ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
        }
    else:
        plan = {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()}
    parallelize_module(net, tp, plan)
    if fsdp and dp.size() > 1:
        if net.kind == "transformer":
            fully_shard(net.block, mesh=dp)
        fully_shard(net, mesh=dp)


class MPTask(Task):
    """`opt`: "adamw" or "sgd"; `loss_parallel`: the head's logits stay class-sharded and the loss is
    computed on them by torch's loss_parallel: True under ModelParallelStrategy(loss_parallel=True), "step"
    inside training_step's own ``with loss_parallel():`` (the step returns a DTensor loss)."""

    def __init__(
        self,
        kind: str = "transformer",
        dtype=torch.float64,
        opt: str = "adamw",
        loss_parallel=False,
        kill: tuple[int, int] = (-1, -1),
    ):
        super().__init__()
        torch.manual_seed(3)
        self.net = Net(kind).to(dtype)
        self.opt, self.loss_parallel, self.kill = opt, loss_parallel, kill
        self.losses: list[float] = []
        self.norms: list[float] = []  # the gradients' global norm before clipping, from whole gradients

    def configure_model(self) -> None:
        parallelize(self.net, self.device_mesh, self.loss_parallel)

    def training_step(self, batch, batch_idx):
        restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        if (self.global_rank, self.global_step) == tuple(self.kill) and restart == 0:
            os.kill(os.getpid(), signal.SIGKILL)
        x, y = batch
        logits = self.net(x)
        if self.loss_parallel == "step":
            from torch.distributed.tensor.parallel import loss_parallel

            with loss_parallel():
                loss = F.cross_entropy(logits.reshape(-1, CLASSES), y.reshape(-1))
        else:
            loss = F.cross_entropy(logits.reshape(-1, CLASSES), y.reshape(-1))
        self.losses.append(
            float(loss.detach().full_tensor() if hasattr(loss, "full_tensor") else loss.detach())
        )
        return loss

    def on_before_optimizer_step(self, optimizer):
        total = torch.zeros((), dtype=torch.float64)
        for p in self.parameters():
            if p.grad is not None:
                g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
                total += g.double().pow(2).sum()
        self.norms.append(float(total.sqrt()))

    def configure_optimizers(self):
        if self.opt == "sgd":
            return torch.optim.SGD(self.parameters(), lr=0.1)
        return torch.optim.AdamW(self.parameters(), lr=0.01, weight_decay=0.1)


def make_data(dtype=torch.float64, n: int = N) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(
        torch.randn(n, T, D, generator=g).to(dtype), torch.randint(0, CLASSES, (n, T), generator=g)
    )


def reference(kind: str, dtype, opt: str, steps: int, batch: int, clip: tuple[float, str] | None):
    """One process, the global batches in order: (losses, pre-clip norms, final weights)."""
    task = MPTask(kind, dtype, opt)
    optimizer = task.configure_optimizers()
    x, y = make_data(dtype).tensors
    losses, norms = [], []
    for i in range(steps):
        xb, yb = x[i * batch : (i + 1) * batch], y[i * batch : (i + 1) * batch]
        optimizer.zero_grad()
        loss = F.cross_entropy(task.net(xb).reshape(-1, CLASSES), yb.reshape(-1))
        loss.backward()
        losses.append(float(loss.detach()))
        if clip is not None and clip[1] == "value":
            norms.append(float(torch.nn.utils.get_total_norm([p.grad for p in task.parameters()])))
            torch.nn.utils.clip_grad_value_(task.parameters(), clip[0])
        elif clip is not None:
            norms.append(float(torch.nn.utils.clip_grad_norm_(task.parameters(), clip[0])))
        optimizer.step()
    return losses, norms, {k: v.detach().clone() for k, v in task.state_dict().items()}


def full_state(task: nn.Module) -> dict[str, torch.Tensor]:
    """The whole weights on every rank (a collective)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(task, options=StateDictOptions(full_state_dict=True))
    return {k: v.detach().cpu().clone() for k, v in state.items()}


class StartStep(Callback):
    step = -1

    def on_train_start(self, trainer, task):
        self.step = trainer.global_step


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("root")
    p.add_argument("--kill-rank", type=int, default=-1)
    p.add_argument("--kill-step", type=int, default=-1)
    args = p.parse_args()
    start = StartStep()
    trainer = Trainer(
        strategy=ModelParallelStrategy(data_parallel_size=1, tensor_parallel_size=2, timeout=60),
        accelerator="cpu",
        devices=2,
        precision="64-true",
        max_steps=8,
        resume="auto",
        default_root_dir=args.root,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        gradient_clip_val=0.5,
        callbacks=[
            start,
            ModelCheckpoint(
                dirpath=os.path.join(args.root, "ckpts"), every_n_train_steps=2, save_last=True, save_top_k=0
            ),
        ],
    )
    task = MPTask(kill=(args.kill_rank, args.kill_step))
    trainer.fit(task, DataLoader(make_data(), batch_size=6, shuffle=True))
    state = full_state(task)
    if trainer.is_global_zero:
        torch.save({"state": state, "started_at": start.step, "steps": trainer.global_step}, args.out)


if __name__ == "__main__":
    main()
