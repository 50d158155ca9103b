"""A user's fault-tolerant DDP (or HSDP) script: one replica group per torchrun job, or plain DDP to compare.

torchrun ... replica_train.py OUT_DIR [--strategy ddp|fsdp] [--plain] [--groups N] [--min-replicas M]
                              [--epochs E] [--step-sleep S] [--ckpt-every K]

Each replica group's rank 0 prints one line per optimizer step (at on_train_batch_end):
    STEP g=<group> gs=<global step> ep=<epoch> b=<batch in epoch> t=<monotonic s> pid=<pid> ids=<sample ids>
         w=<weights digest> rng=<torch RNG digest> dt=<seconds since the previous STEP line>
and saves its final weights to OUT_DIR/group<G>.pt (plain: OUT_DIR/plain.pt). The group, the number of groups
and the lighthouse come from TANDEM_REPLICA_GROUP, TANDEM_REPLICA_GROUPS and TORCHFT_LIGHTHOUSE.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from callbacks import Callback, ModelCheckpoint  # noqa: E402
from strategies.ddp import DDPStrategy  # noqa: E402
from strategies.fault_tolerance import FaultTolerance  # noqa: E402
from strategies.fsdp import FSDPStrategy  # noqa: E402
from trainer import Task, Trainer, seed_everything  # noqa: E402

SAMPLES, FEATURES = 512, 6


def digest(tensors: list[torch.Tensor]) -> str:
    h = hashlib.sha1()
    for t in tensors:
        h.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:12]


class Net(Task):
    def __init__(self, width: int = 32, step_sleep: float = 0.0) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(FEATURES, width),
            torch.nn.Tanh(),
            torch.nn.Dropout(0.1),  # draws from the RNG every step: a rejoining group must take it over
            torch.nn.Linear(width, width),
            torch.nn.Tanh(),
            torch.nn.Linear(width, 3),
        ).double()
        self.step_sleep = step_sleep
        self.ids: list[int] = []

    def training_step(self, batch, batch_idx):
        if self.step_sleep:
            time.sleep(self.step_sleep)
        x, y, ids = batch
        self.ids = ids[:4].tolist()
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=0.01)


class StepLog(Callback):
    def __init__(self, group: int, stop_file: str | None) -> None:
        self.group, self.last, self.stop_file = group, None, stop_file

    def on_train_batch_end(self, trainer, task, outputs, batch, batch_idx):
        if self.stop_file and os.path.exists(self.stop_file):  # every group stops at the step the file names
            with open(self.stop_file) as f:
                text = f.read().strip()
            trainer.should_stop = bool(text) and trainer.global_step >= int(text)
        weights = [
            p.full_tensor() if hasattr(p, "full_tensor") else p for p in task.parameters()
        ]  # (every rank)
        if trainer.strategy.comm.rank != 0:
            return
        now = time.monotonic()
        dt = 0.0 if self.last is None else now - self.last
        self.last = now
        ids = ",".join(map(str, task.ids))
        replicas = trainer.strategy.replicas
        committed = int(bool(replicas.committed)) if replicas is not None else 1
        live = replicas.manager.participants if replicas is not None and replicas.manager is not None else 0
        print(
            f"STEP g={self.group} gs={trainer.global_step} ep={trainer.current_epoch} b={batch_idx + 1} "
            f"t={now:.3f} pid={os.getpid()} ids={ids} w={digest(weights)} rng={digest([torch.get_rng_state()])} "
            f"dt={dt:.3f} c={committed} p={live}",
            flush=True,
        )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--strategy", choices=("ddp", "fsdp"), default="ddp")
    p.add_argument("--plain", action="store_true", help="plain DDP over every process, no fault tolerance")
    p.add_argument("--min-replicas", type=int, default=1)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--step-sleep", type=float, default=0.0)
    p.add_argument("--ckpt-every", type=int, default=0, help="ModelCheckpoint every K steps, resume='auto'")
    p.add_argument("--stop-file", help="stop at the global step this file names, once it exists")
    p.add_argument("--restart-delay", type=float, default=0.0, help="a restarted worker waits this long first "
                   "(stands for a larger job's restart: loading the model and its checkpoint)")  # fmt: skip
    p.add_argument("--timeout-s", type=float, default=10.0)
    p.add_argument("--quorum-timeout-s", type=float, default=30.0)
    args = p.parse_args()
    if int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0:
        time.sleep(args.restart_delay)
    seed_everything(0)
    group = int(os.environ.get("TANDEM_REPLICA_GROUP", "0"))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(SAMPLES, FEATURES, generator=g, dtype=torch.float64)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    data = TensorDataset(x, y, torch.arange(SAMPLES))
    loader = DataLoader(data, batch_size=args.batch, shuffle=True)
    devices = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    nodes = int(os.environ.get("WORLD_SIZE", "1")) // devices if args.plain else 1
    ft = None
    if not args.plain:
        ft = FaultTolerance(
            min_replicas=args.min_replicas, timeout_s=args.timeout_s, quorum_timeout_s=args.quorum_timeout_s
        )
    common = {"devices": devices, "num_nodes": nodes, "timeout_s": 60, "fault_tolerance": ft}
    strategy = DDPStrategy(**common) if args.strategy == "ddp" else FSDPStrategy(min_params=1, **common)
    name = "plain" if args.plain else f"group{group}"
    root = os.path.join(args.out, name)
    callbacks: list[Callback] = [StepLog(group, args.stop_file)]
    if args.ckpt_every:
        callbacks.append(ModelCheckpoint(dirpath=os.path.join(root, "ckpts"), every_n_train_steps=args.ckpt_every,
                                         save_last=True, save_top_k=0))  # fmt: skip
    trainer = Trainer(
        strategy=strategy,
        max_epochs=args.epochs,
        default_root_dir=root,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=bool(args.ckpt_every),
        num_sanity_val_steps=0,
        callbacks=callbacks,
        resume="auto" if args.ckpt_every else None,
        deterministic=True,
    )
    task = Net(args.width, args.step_sleep)
    print(f"WORKER g={group} rank={os.environ.get('RANK', '0')} pid={os.getpid()}", flush=True)
    trainer.fit(task, loader)
    weights = {
        k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
        for k, v in task.state_dict().items()
    }
    if trainer.strategy.comm.rank == 0:
        torch.save(weights, os.path.join(args.out, f"{name}.pt"))
        print(f"DONE g={group} gs={trainer.global_step} pid={os.getpid()}", flush=True)


if __name__ == "__main__":
    main()
