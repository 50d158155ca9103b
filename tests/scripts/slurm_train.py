"""A user's DDP script for the SLURM lab (tests/test_slurm_lab.py), run by srun, by a batch script without
srun (it then starts its workers itself), or by hand as the reference:

python slurm_train.py OUT ROOT [--devices D] [--num-nodes N] [--epochs E] [--step-sleep S] [--first-attempt-slow]

Checkpoints: only the one a stop signal writes (ROOT/ckpts/last.ckpt; no periodic ones), and the run resumes
from it (resume="auto"), so a resumed run that ends equal to an uninterrupted one shows the signal's
checkpoint was taken at a step boundary and restored whole. Rank 0 prints `TRAIN_START step=S t=T` when
training starts (S: the resumed step) and saves the final weights and step to OUT.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from callbacks import ModelCheckpoint  # noqa: E402
from strategies.ddp import DDPStrategy  # noqa: E402
from trainer import Task, Trainer, seed_everything  # noqa: E402


class Net(Task):
    def __init__(self, step_sleep: float) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(6, 32), torch.nn.Tanh(), torch.nn.Dropout(0.1), torch.nn.Linear(32, 3)
        )
        self.step_sleep = step_sleep

    def on_train_start(self) -> None:
        if self.global_rank == 0:
            job = os.environ.get("SLURM_JOB_ID", "-")
            restarts = os.environ.get("SLURM_RESTART_COUNT", "0")
            print(
                f"TRAIN_START step={self.global_step} t={time.time():.3f} job={job} restarts={restarts}",
                flush=True,
            )

    def training_step(self, batch, batch_idx):
        time.sleep(self.step_sleep)  # slow steps leave room to signal the job mid-run
        if self.global_rank == 0:
            print(f"STEP {self.global_step} t={time.time():.3f}", flush=True)
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("root")
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--num-nodes", type=int, default=1)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--step-sleep", type=float, default=0.0)
    p.add_argument(
        "--first-attempt-slow",
        action="store_true",
        help="sleep only before the job is requeued (a time-limit test: the requeued job then ends in time)",
    )
    args = p.parse_args()
    if args.first_attempt_slow and os.environ.get("SLURM_RESTART_COUNT", "0") != "0":
        args.step_sleep = 0.0
    seed_everything(0)
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(128, 6, generator=g), torch.randint(0, 3, (128,), generator=g))
    task = Net(args.step_sleep)
    trainer = Trainer(
        strategy=DDPStrategy(accelerator="cpu", timeout_s=120),
        accelerator="cpu",
        devices=args.devices,
        num_nodes=args.num_nodes,
        max_epochs=args.epochs,
        deterministic=True,
        resume="auto",
        default_root_dir=args.root,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[ModelCheckpoint(dirpath=os.path.join(args.root, "ckpts"), save_top_k=0)],
    )
    trainer.fit(task, DataLoader(data, batch_size=8, shuffle=True))
    if trainer.is_global_zero:
        weights = {k: v.clone() for k, v in task.state_dict().items()}
        torch.save({"weights": weights, "step": trainer.global_step}, args.out)
        print(f"DONE step={trainer.global_step} world={trainer.world_size} t={time.time():.3f}", flush=True)


if __name__ == "__main__":
    main()
