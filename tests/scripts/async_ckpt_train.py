"""Trains with AsyncCheckpointIO, a ModelCheckpoint every step (top 2 by step, and last.ckpt) and
resume="auto", so that a test can SIGKILL it at random moments of its background saves and check what is left.

    python tests/scripts/async_ckpt_train.py ROOT MAX_STEPS [--sync] [--fsdp]

With --fsdp: strategy="fsdp" at 2 processes (started by the script itself), checkpoints are directories of
shards written with DCP in the plugin's writer thread. Rank 0 prints "resumed <step>" when fit starts (the step it resumed at, 0
for a fresh start), "saving <step>" when a save starts and "step <step>" after each step; the final weights
(whole) go to ROOT/final.pt when it ends.
"""

from __future__ import annotations

import os
import sys
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from callbacks import Callback, ModelCheckpoint  # noqa: E402
from trainer import Task, Trainer  # noqa: E402
from trainer.plugins import AsyncCheckpointIO  # noqa: E402

WIDTH = 2048  # two 2048 x 2048 layers and AdamW: a checkpoint of about 100 MB


class Net(Task):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh(), torch.nn.Linear(WIDTH, 1)
        )

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def on_save_checkpoint(self, checkpoint):
        if self.global_rank == 0:
            print(f"saving {checkpoint['global_step']}", flush=True)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-4)


class Report(Callback):
    def on_train_start(self, trainer, task):
        if trainer.is_global_zero:
            print(f"resumed {trainer.global_step}", flush=True)

    def on_train_batch_end(self, trainer, task, outputs, batch, batch_idx):
        if trainer.is_global_zero:
            print(f"step {trainer.global_step}", flush=True)
        time.sleep(0.05)


def main() -> None:
    root, max_steps = sys.argv[1], int(sys.argv[2])
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(64, WIDTH, generator=g), torch.randn(64, 1, generator=g))
    ckpt = ModelCheckpoint(
        dirpath=os.path.join(root, "ckpt"), every_n_train_steps=1, save_top_k=2, monitor="step", mode="max",
        save_last=True,
    )  # fmt: skip
    fsdp = "--fsdp" in sys.argv
    trainer = Trainer(
        max_steps=max_steps,
        accelerator="cpu",
        strategy="fsdp" if fsdp else "single",
        devices=2 if fsdp else 1,
        default_root_dir=root,
        callbacks=[ckpt, Report()],
        plugins=None if "--sync" in sys.argv else [AsyncCheckpointIO()],
        resume="auto",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    task = Net()
    trainer.fit(task, DataLoader(data, batch_size=8))
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    whole = get_model_state_dict(task, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if trainer.is_global_zero:
        torch.save({k: v.clone() for k, v in whole.items()}, os.path.join(root, "final.pt"))
        print("done", flush=True)


if __name__ == "__main__":
    main()
