"""The FSDP tests' model and data, and a user's script for the kill-and-restart test:

python fsdp_train.py OUT ROOT [--kill-rank R --kill-step S] [--accelerator cuda [--cpu-offload]]

plain (Tandem starts 2 workers) or under torchrun. Checkpoints go to ROOT/ckpts every 2 steps; resume="auto".
Rank 0 saves the final full weights to OUT.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from callbacks import ModelCheckpoint  # noqa: E402
from strategies.fsdp import FSDPStrategy  # noqa: E402
from trainer import Task, Trainer, seed_everything  # noqa: E402

WIDTH, DEPTH, CLASSES = 24, 4, 3


class Block(torch.nn.Module):
    """A residual MLP block: the unit FSDP shards (wrap=["Block"])."""

    def __init__(self, width: int, dropout: float) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.fc = torch.nn.Linear(width, width)
        self.drop = torch.nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.drop(torch.tanh(self.fc(self.norm(x))))


class Tower(Task):
    """Input layer, DEPTH blocks, a head; `opt` is "sgd" (with momentum), "plain-sgd" (no optimizer state)
    or "adam"."""

    def __init__(
        self, opt: str = "adam", lr: float = 0.01, dropout: float = 0.0, kill: tuple[int, int] = (-1, -1)
    ):
        super().__init__()
        torch.manual_seed(1)
        self.inp = torch.nn.Linear(6, WIDTH)
        self.blocks = torch.nn.Sequential(*[Block(WIDTH, dropout) for _ in range(DEPTH)])
        self.head = torch.nn.Linear(WIDTH, CLASSES)
        self.opt, self.lr, self.kill = opt, lr, kill
        self.dtypes: set[torch.dtype] = set()  # of the activations between blocks

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.blocks(self.inp(x))
        self.dtypes.add(h.dtype)
        return self.head(h)

    def training_step(self, batch, batch_idx):
        restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        if (self.global_rank, self.global_step) == tuple(self.kill) and restart == 0:
            os.kill(os.getpid(), signal.SIGKILL)  # a preempted node: no cleanup, no traceback
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val/loss", F.cross_entropy(self(x), y), on_epoch=True, sync_dist=True)

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test/loss", F.cross_entropy(self(x), y), on_epoch=True, sync_dist=True)

    def configure_optimizers(self):
        if self.opt == "plain-sgd":
            return torch.optim.SGD(self.parameters(), lr=self.lr)
        if self.opt == "sgd":
            return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)
        return torch.optim.Adam(self.parameters(), lr=self.lr)


def make_data(n: int = 48) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(n, 6, generator=g), torch.randint(0, CLASSES, (n,), generator=g))


def full_state(task: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The task's whole weights on every rank (gathered from the shards under FSDP), as CPU copies."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(task, options=StateDictOptions(full_state_dict=True))
    return {k: v.detach().cpu().clone() for k, v in state.items()}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("root")
    p.add_argument("--kill-rank", type=int, default=-1)
    p.add_argument("--kill-step", type=int, default=-1)
    p.add_argument("--accelerator", default="cpu")
    p.add_argument("--cpu-offload", action="store_true")
    args = p.parse_args()
    seed_everything(0)
    trainer = Trainer(
        strategy=FSDPStrategy(wrap=["Block"], cpu_offload=args.cpu_offload),
        accelerator=args.accelerator,
        devices=2,
        max_epochs=2,
        deterministic=True,
        resume="auto",
        default_root_dir=args.root,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[
            ModelCheckpoint(
                dirpath=os.path.join(args.root, "ckpts"), every_n_train_steps=2, save_last=True, save_top_k=0
            )
        ],
    )
    task = Tower(dropout=0.2, kill=(args.kill_rank, args.kill_step))
    trainer.fit(task, DataLoader(make_data(96), batch_size=6, shuffle=True))
    state = full_state(task)  # a collective: every rank takes part
    shard = next(iter(task.parameters())).to_local()
    print(f"rank {trainer.global_rank}: shards on {shard.device.type}", flush=True)
    if trainer.is_global_zero:
        torch.save(state, args.out)


if __name__ == "__main__":
    main()
