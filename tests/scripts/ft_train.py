"""Fault-tolerance scenarios, run by tests/test_fault_tolerance.py as a user's script:

python ft_train.py OUT ROOT [--kill-rank R --kill-step S] [--max-restarts N] [--sigterm-wait]
                            [--uneven] [--stall-rank R] [--timeout-s T] [--step-sleep S] [--val-sleep S]
                          [--single | --fsdp]

--step-sleep makes every training step last S seconds (rank 0 prints "STEP n" as it starts step n);
--val-sleep adds a validation set at each epoch's end whose batches last S seconds ("VAL i"). Neither
changes the arithmetic, so a run with them ends bit-identical to one without.

Rank 0 saves the final weights to OUT. Checkpoints go to ROOT/ckpts every 2 steps; resume="auto". Each
rank prints "rank R attempt A: starts at step S" at on_train_start and "rank R attempt A: first step S" at its
first training_step (A: torchrun's TORCHELASTIC_RESTART_COUNT).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from callbacks import Callback, ModelCheckpoint  # noqa: E402
from strategies.ddp import DDPStrategy  # noqa: E402
from strategies.fsdp import FSDPStrategy  # noqa: E402
from trainer import Task, Trainer, seed_everything  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fsdp_train import full_state  # noqa: E402


class Net(Task):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(6, 32), torch.nn.ReLU(), torch.nn.Dropout(0.3), torch.nn.Linear(32, 3)
        )
        self.args = args
        self.first_step_reported = False

    def training_step(self, batch, batch_idx):
        a, restart = self.args, int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        if not self.first_step_reported:  # which step this attempt trains first (a resume: the saved one)
            print(f"rank {self.global_rank} attempt {restart}: first step {self.global_step}", flush=True)
            self.first_step_reported = True
        if self.global_rank == a.kill_rank and self.global_step == a.kill_step and restart == 0:
            os.kill(os.getpid(), signal.SIGKILL)  # a preempted node: no cleanup, no traceback
        if self.global_rank == a.stall_rank and self.global_step == 3:
            time.sleep(3600)  # stuck outside any collective: the others must time out
        if a.step_sleep:
            if self.global_rank == 0:
                print(f"STEP {self.global_step}", flush=True)
            time.sleep(a.step_sleep)
        if a.sigterm_wait:
            if self.global_step == 3 and self.global_rank == 0:
                print("READY", flush=True)
            time.sleep(0.05)
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        if self.global_rank == 0 and not self.trainer.sanity_checking:
            print(f"VAL {batch_idx}", flush=True)
        time.sleep(self.args.val_sleep)
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


class StartReport(Callback):
    """Prints the global step each attempt's training starts at (after a resume: the checkpoint's)."""

    def on_train_start(self, trainer, task):
        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        print(
            f"rank {trainer.global_rank} attempt {restart}: starts at step {trainer.global_step}", flush=True
        )


class Stream(IterableDataset):
    """A stream whose length differs by rank: rank 0 yields 10 batches of 4, rank 1 yields 7."""

    def __iter__(self):
        rank = int(os.environ.get("RANK", 0))
        g = torch.Generator().manual_seed(rank)
        for _ in range(40 if rank == 0 else 28):
            yield torch.randn(6, generator=g), torch.randint(0, 3, (), generator=g)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("root")
    p.add_argument("--kill-rank", type=int, default=-1)
    p.add_argument("--kill-step", type=int, default=-1)
    p.add_argument("--stall-rank", type=int, default=-1)
    p.add_argument("--max-restarts", type=int, default=0)
    p.add_argument("--timeout-s", type=float, default=1800)
    p.add_argument("--sigterm-wait", action="store_true")
    p.add_argument("--uneven", choices=["", "map", "stream"], default="")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--step-sleep", type=float, default=0.0)
    p.add_argument("--val-sleep", type=float, default=-1.0, help=">= 0: validate at each epoch's end")
    p.add_argument("--single", action="store_true", help="one process, strategy='single'")
    p.add_argument("--fsdp", action="store_true", help="FSDPStrategy (sharded directory checkpoints)")
    args = p.parse_args()
    seed_everything(0)
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(96, 6, generator=g), torch.randint(0, 3, (96,), generator=g))
    if args.uneven == "map":  # a user's own per-rank split: rank 0 gets 40 samples, rank 1 gets 28
        rank = int(os.environ.get("RANK", 0))
        data = torch.utils.data.Subset(data, range(40) if rank == 0 else range(40, 68))
    loader = (
        DataLoader(Stream(), batch_size=4)
        if args.uneven == "stream"
        else DataLoader(data, batch_size=8, shuffle=True)
    )
    val = None
    if args.val_sleep >= 0:  # 64 samples: 8 batches of 4 per rank
        gv = torch.Generator().manual_seed(1)
        val = DataLoader(
            TensorDataset(torch.randn(64, 6, generator=gv), torch.randint(0, 3, (64,), generator=gv)), 4
        )
    trainer = Trainer(
        strategy="single"
        if args.single
        else (FSDPStrategy if args.fsdp else DDPStrategy)(
            accelerator="cpu", devices=2, max_restarts=args.max_restarts, timeout_s=args.timeout_s
        ),
        accelerator="cpu",
        max_epochs=args.epochs,
        deterministic=True,
        resume="auto",
        default_root_dir=args.root,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        use_distributed_sampler=args.uneven == "",
        num_sanity_val_steps=0,
        callbacks=[
            ModelCheckpoint(
                dirpath=os.path.join(args.root, "ckpts"), every_n_train_steps=2, save_last=True, save_top_k=0
            ),
            StartReport(),
        ],
    )
    task = Net(args)
    try:
        trainer.fit(task, loader, val)
    except SystemExit as e:  # a stop signal: say how this worker ends (the launcher does not report it)
        who = f"rank {os.environ['RANK']}" if "RANK" in os.environ else "launcher"  # fit() relaunches
        print(f"{who} exits with {e.code}", file=sys.stderr, flush=True)
        raise
    print(f"rank {trainer.global_rank} finished at step {trainer.global_step}", flush=True)
    state = full_state(task) if args.fsdp else {k: v.clone() for k, v in task.state_dict().items()}
    if trainer.is_global_zero:
        torch.save(state, args.out)


if __name__ == "__main__":
    main()
