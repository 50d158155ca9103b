"""Side-by-side FSDP benchmark: Tandem's fsdp strategy vs a hand-written torch ``fully_shard`` loop vs
Tandem's ddp, on the same transformer-like model, at 2 and 3 gloo processes on the CPU.

Per contender and world size: ms per training step (median), and per rank (a) the bytes of parameters,
gradients and optimizer state it holds (counted tensor by tensor: exact) and (b) its peak memory during the
measured steps: the peak RSS (reset after the warm-up through /proc/self/clear_refs) minus the RSS once
training is over and its tensors are freed, so imported code and other fixed costs cancel. tracemalloc
cannot measure this: it sees only Python's allocator, not the one torch's CPU tensors come from.
Every contender runs in fresh processes, interleaved in rounds; the median over rounds is reported.

    python benchmarks/fsdp.py            # full run, writes benchmarks/results/fsdp.json
    python benchmarks/fsdp.py --quick    # a fast smoke run
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import queue as queue_module
import statistics
import sys
import time
import warnings
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # first: benchmarks/strategies.py would shadow the strategies package

from callbacks import Callback  # noqa: E402
from strategies.ddp import DDPStrategy  # noqa: E402
from strategies.fsdp import FSDPStrategy  # noqa: E402
from strategies.launch import _free_port  # noqa: E402
from trainer import Task, Trainer  # noqa: E402

RESULTS = os.path.join(ROOT, "benchmarks", "results")
VOCAB, WIDTH, HEADS, DEPTH, SEQ, BATCH = 1024, 384, 6, 6, 64, 4  # BATCH: sequences per rank per step
CONTENDERS = ("raw_fully_shard", "tandem_fsdp", "tandem_ddp")


class Block(nn.Module):
    """Pre-norm transformer block: self-attention and a 4x MLP, each residual."""

    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.attn = nn.MultiheadAttention(WIDTH, HEADS, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class LM(nn.Module):
    """Embedding, DEPTH blocks, a norm and an output layer: 11.4M parameters (46 MB in fp32)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(DEPTH))
        self.norm, self.out = nn.LayerNorm(WIDTH), nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.out(self.norm(x))


def loss_of(model: nn.Module, batch: list[torch.Tensor]) -> torch.Tensor:
    tokens, targets = batch
    return F.cross_entropy(model(tokens).flatten(0, 1), targets.flatten())


class LMTask(Task):
    def __init__(self) -> None:
        super().__init__()
        self.lm = LM()

    def training_step(self, batch, batch_idx):
        return loss_of(self.lm, batch)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-4)


def dataset(world: int, steps: int) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    n = world * BATCH * steps
    return TensorDataset(
        torch.randint(0, VOCAB, (n, SEQ), generator=g), torch.randint(0, VOCAB, (n, SEQ), generator=g)
    )


def _status(field: str) -> int:
    """A /proc/self/status memory field, in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def held_bytes(params: list[torch.Tensor], optimizer: torch.optim.Optimizer) -> int:
    """Bytes of this rank's parameters, gradients and optimizer state (its shards under FSDP)."""
    from torch.distributed.tensor import DTensor

    def size(t: torch.Tensor) -> int:
        t = t.to_local() if isinstance(t, DTensor) else t
        return t.numel() * t.element_size()

    total = sum(size(p) + (size(p.grad) if p.grad is not None else 0) for p in params)
    return total + sum(size(v) for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v))


class Meter:
    """Step times, held bytes before the step, and the peak RSS after the warm-up."""

    def __init__(self, warmup: int) -> None:
        self.warmup, self.starts, self.held = warmup, [], 0

    def step_start(self, index: int) -> None:
        self.starts.append(time.perf_counter())
        if index == self.warmup:
            with open("/proc/self/clear_refs", "w") as f:  # the peak RSS from now on
                f.write("5")

    def before_step(self, params: list[torch.Tensor], optimizer: torch.optim.Optimizer) -> None:
        self.held = max(self.held, held_bytes(params, optimizer))

    def result(self) -> dict[str, float]:
        """Call once the model, optimizer and trainer are gone."""
        gc.collect()  # the task and the trainer refer to each other
        # from one step's start to the next's (the last step's end would include Tandem's epoch end)
        ms = [(b - a) * 1e3 for a, b in zip(self.starts[self.warmup :], self.starts[self.warmup + 1 :])]
        return {
            "ms": statistics.median(ms),
            "held_mb": self.held / 2**20,
            "peak_mb": (_status("VmHWM") - _status("VmRSS")) / 2**20,
        }


class MeterCallback(Callback):
    def __init__(self, meter: Meter) -> None:
        self.meter = meter

    def on_train_batch_start(self, trainer, task, batch, batch_idx):
        self.meter.step_start(batch_idx)

    def on_before_optimizer_step(self, trainer, task, optimizer):
        self.meter.before_step(list(task.parameters()), optimizer)


def raw_loop(world: int, steps: int, meter: Meter) -> None:
    """What a user writes by hand with torch's fully_shard: the reference for Tandem's overhead."""
    from torch.distributed.fsdp import fully_shard

    model = LM()
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    data = dataset(world, steps)
    sampler = DistributedSampler(data, num_replicas=world, rank=dist.get_rank(), shuffle=False)
    for index, batch in enumerate(DataLoader(data, batch_size=BATCH, sampler=sampler)):
        meter.step_start(index)
        loss_of(model, batch).backward()
        meter.before_step(list(model.parameters()), optimizer)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def tandem(contender: str, world: int, steps: int, meter: Meter) -> None:
    strategy = FSDPStrategy(wrap=[Block]) if contender == "tandem_fsdp" else DDPStrategy()
    trainer = Trainer(
        strategy=strategy, accelerator="cpu", devices=world, max_epochs=1, callbacks=[MeterCallback(meter)],
        logger=False, enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False,
        num_sanity_val_steps=0,
    )  # fmt: skip
    trainer.fit(LMTask(), DataLoader(dataset(world, steps), batch_size=BATCH))


def worker(rank: int, world: int, port: int, contender: str, warmup: int, steps: int, queue: Any) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
    )  # fmt: skip
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module")  # LM's output is a view: harmless here
    meter = Meter(warmup)
    if contender == "raw_fully_shard":
        raw_loop(world, warmup + steps, meter)
    else:
        tandem(contender, world, warmup + steps, meter)
    queue.put((rank, meter.result()))
    dist.destroy_process_group()


def run_group(target: Any, world: int, args: tuple, label: str) -> list[dict[str, Any]]:
    """One fresh group of `world` spawned processes `target(rank, world, port, *args, queue)`, each putting
    (rank, result) on the queue; the results by rank. A worker that dies takes the group down with its exit code."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=target, args=(r, world, port, *args, queue)) for r in range(world)]
    for p in procs:
        p.start()
    results: dict[int, dict[str, Any]] = {}
    try:
        while len(results) < world:
            try:
                rank, result = queue.get(timeout=5)
                results[rank] = result
            except queue_module.Empty:
                failed = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                if failed:
                    raise RuntimeError(
                        f"{label} at world {world}: a worker exited with {failed[0]}"
                    ) from None
    finally:
        for p in procs:
            p.join(timeout=30 if len(results) == world else 0)
            if p.is_alive():
                p.kill()
    return [results[r] for r in range(world)]


def run(contender: str, world: int, warmup: int, steps: int) -> list[dict[str, float]]:
    """One fresh group of `world` processes for `contender`; the per-rank results."""
    return run_group(worker, world, (contender, warmup, steps), contender)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--worlds", type=int, nargs="+", default=[2, 3])
    args = parser.parse_args()
    rounds, steps, warmup = (1, 3, 1) if args.quick else (args.rounds, args.steps, args.warmup)
    # large blocks always mmapped and returned when freed, so that peak RSS follows the tensors
    os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"
    load_start = os.getloadavg()[0]
    runs: dict[str, dict[str, list[list[dict[str, float]]]]] = {
        str(w): {c: [] for c in CONTENDERS} for w in args.worlds
    }
    for r in range(rounds):
        for world in args.worlds:
            for contender in CONTENDERS if r % 2 == 0 else CONTENDERS[::-1]:  # neither always goes first
                runs[str(world)][contender].append(run(contender, world, warmup, steps))
                print(
                    f"round {r + 1}/{rounds} world {world} {contender}: {runs[str(world)][contender][-1][0]}",
                    flush=True,
                )
    summary = {
        world: {
            c: {
                key: statistics.median(statistics.mean(rank[key] for rank in one) for one in per_round)
                for key in ("ms", "held_mb", "peak_mb")
            }
            for c, per_round in contenders.items()
        }
        for world, contenders in runs.items()
    }
    params = sum(p.numel() for p in LM().parameters())
    out = {
        "benchmark": "fsdp",
        "machine": {"cpu_cores": os.cpu_count(), "torch": torch.__version__, "load_average_1m": [load_start, os.getloadavg()[0]]},
        "model": {"params": params, "width": WIDTH, "depth": DEPTH, "seq": SEQ, "batch_per_rank": BATCH, "units": "each Block, then the root"},
        "rounds": rounds, "warmup_steps": warmup, "measured_steps": steps,
        "summary": summary, "runs": runs,
    }  # fmt: skip
    print_table(out)
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "fsdp.json"), "w") as f:
        json.dump(out, f, indent=2)


def print_table(out: dict[str, Any]) -> None:
    print(
        f"\n{out['model']['params'] / 1e6:.1f}M parameters; median over {out['rounds']} rounds, mean over ranks"
    )
    print(f"{'world':>5} {'contender':<16}{'ms/step':>9}{'held MB':>9}{'peak MB':>9}  ratios")
    for world, s in out["summary"].items():
        for c, v in s.items():
            print(f"{world:>5} {c:<16}{v['ms']:>9.1f}{v['held_mb']:>9.1f}{v['peak_mb']:>9.1f}")
        fsdp, raw, ddp = s["tandem_fsdp"], s["raw_fully_shard"], s["tandem_ddp"]
        print(
            f"{world:>5} tandem_fsdp / raw_fully_shard: time {fsdp['ms'] / raw['ms']:.3f}x; "
            f"tandem_fsdp / tandem_ddp: time {fsdp['ms'] / ddp['ms']:.2f}x, held {fsdp['held_mb'] / ddp['held_mb']:.3f} "
            f"(1/{world} = {1 / int(world):.3f}), peak {fsdp['peak_mb'] / ddp['peak_mb']:.3f}"
        )


if __name__ == "__main__":
    main()
