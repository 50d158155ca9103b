"""A user's training script, run by the DDP tests as `python ddp_train.py OUT [--fail-rank R --fail-step S]`
(plain, so Tandem launches the workers) and under torchrun. Rank 0 saves the final weights to OUT."""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from trainer import Task, Trainer, seed_everything  # noqa: E402


def make_data(n: int = 64) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g))


class Net(Task):
    def __init__(self, fail_rank: int = -1, fail_step: int = -1, failed_at: str = "") -> None:
        super().__init__()
        self.failed_at = failed_at  # where the failing rank writes the wall time of its failure
        torch.manual_seed(1)
        self.net = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
        self.fail_rank, self.fail_step = fail_rank, fail_step

    def training_step(self, batch, batch_idx):
        if self.global_rank == self.fail_rank and self.global_step == self.fail_step:
            with open(self.failed_at, "w") as f:
                f.write(repr(time.time()))
            raise RuntimeError(f"deliberate failure on rank {self.global_rank} at step {self.global_step}")
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--strategy", default="ddp", choices=["ddp", "fsdp"])
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--fail-rank", type=int, default=-1)
    p.add_argument("--fail-step", type=int, default=-1)
    p.add_argument("--report-threads", action="store_true", help="print the native thread counts")
    args = p.parse_args()
    threads = lambda: len(os.listdir("/proc/self/task"))  # noqa: E731
    before = threads()
    seed_everything(0)
    task = Net(args.fail_rank, args.fail_step, args.out + ".failed_at")
    trainer = Trainer(
        strategy=args.strategy,
        accelerator="cpu",
        devices=args.devices,
        max_epochs=2,
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    trainer.fit(task, DataLoader(make_data(), batch_size=args.batch_size))
    if trainer.is_global_zero and args.strategy == "ddp":
        torch.save({k: v.clone() for k, v in task.state_dict().items()}, args.out)
    if args.report_threads:
        from strategies.group_exit import close_groups

        after_fit = threads()
        del trainer, task
        held = close_groups()  # what atexit runs
        print(
            f"rank {os.environ['RANK']} threads: before {before}, after fit {after_fit}, after closing {threads()}"
            f" (groups still held: {held})"
        )


if __name__ == "__main__":
    main()
