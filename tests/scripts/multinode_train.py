"""A user's DDP script for the multi-node lab, run under torchrun on one or two nodes:

torchrun ... multinode_train.py OUT ROOT --devices D --num-nodes N [--width W] [--timeout-s T]
                                [--kill-rank R --kill-step S] [--epochs E]

Rank 0 saves the final weights to OUT. With --ckpt, checkpoints go to ROOT/ckpts every 2 steps and the run
resumes from the last one (resume="auto"), as after a torchrun restart.
"""

from __future__ import annotations

import argparse
import os
import signal
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
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        torch.manual_seed(1)
        w = args.width
        self.net = torch.nn.Sequential(
            torch.nn.Linear(6, w),
            torch.nn.Tanh(),
            torch.nn.Linear(w, w),
            torch.nn.Tanh(),
            torch.nn.Linear(w, 3),
        )
        self.args = args

    def training_step(self, batch, batch_idx):
        a, restart = self.args, int(os.environ.get("TANDEM_TEST_RESTART", "0"))
        if self.global_rank == a.kill_rank and self.global_step == a.kill_step and restart == 0:
            print(f"rank {self.global_rank} SIGKILLs itself at step {self.global_step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)  # a preempted node: no cleanup, no traceback
        if a.step_sleep:
            time.sleep(a.step_sleep)  # slow steps leave time to cut the link mid-run
        if self.global_step == 1:
            print(f"rank {self.global_rank} at step 1", flush=True)
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("root")
    p.add_argument("--devices", type=int, default=1)
    p.add_argument("--num-nodes", type=int, default=2)
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--samples", type=int, default=128)
    p.add_argument("--timeout-s", type=float, default=60)
    p.add_argument("--kill-rank", type=int, default=-1)
    p.add_argument("--kill-step", type=int, default=-1)
    p.add_argument("--step-sleep", type=float, default=0.0)
    p.add_argument("--ckpt", action="store_true", help="checkpoint every 2 steps and resume='auto'")
    p.add_argument(
        "--no-attempt-prefix",
        action="store_true",
        help="experiment: hide torchrun's shared store from Tandem, so it joins through env:// without "
        "this start's own key (strategies/attempt.py), as torch itself does",
    )
    args = p.parse_args()
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    os.environ["TANDEM_TEST_RESTART"] = restart or "0"  # read by the kill switch, whatever Tandem sees
    if args.no_attempt_prefix:
        os.environ.pop("TORCHELASTIC_USE_AGENT_STORE", None)
    print(f"worker rank {os.environ.get('RANK')} starts, TORCHELASTIC_RESTART_COUNT={restart}", flush=True)
    seed_everything(0)
    g = torch.Generator().manual_seed(0)
    n = args.samples
    data = TensorDataset(torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g))
    callbacks = []
    if args.ckpt:
        callbacks.append(
            ModelCheckpoint(
                dirpath=os.path.join(args.root, "ckpts"), every_n_train_steps=2, save_last=True, save_top_k=0
            )
        )
    trainer = Trainer(
        strategy=DDPStrategy(accelerator="cpu", devices=args.devices, timeout_s=args.timeout_s),
        accelerator="cpu",
        devices=args.devices,
        num_nodes=args.num_nodes,
        max_epochs=args.epochs,
        deterministic=True,
        resume="auto" if args.ckpt else None,
        default_root_dir=args.root,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=args.ckpt,
        callbacks=callbacks,
    )
    start = time.perf_counter()
    task = Net(args)
    trainer.fit(task, DataLoader(data, batch_size=8, shuffle=True))
    print(
        f"rank {trainer.global_rank}/{trainer.world_size} finished at step {trainer.global_step} "
        f"in {time.perf_counter() - start:.2f}s",
        flush=True,
    )
    if trainer.is_global_zero:
        torch.save({k: v.clone() for k, v in task.state_dict().items()}, args.out)


if __name__ == "__main__":
    main()
