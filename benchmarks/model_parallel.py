"""Side-by-side model-parallel benchmark on one small transformer, gloo processes on the CPU: data parallel
(ddp, our Reducer), ZeRO-1 (ddp with zero=1), fsdp, tensor parallel (tp), fsdp x tp, and pipeline parallel
(1F1B), all through the Trainer on the same global batch.

Per contender: ms per training step (median over the measured steps, median over rounds) and, per rank,
(a) the bytes of parameters, gradients and optimizer state it holds before the optimizer step, counted tensor
by tensor (the local shards of DTensors, nothing for a pipeline's other stages, ZeRO's own share of the
state), and (b) its peak memory during the measured steps (peak RSS after the warm-up minus the RSS after
training, as benchmarks/fsdp.py measures it). Every contender runs in fresh processes, interleaved in rounds.

The tp and fsdp x tp rows run ModelParallelStrategy with this script's task (its configure_model is the TP
plan), on the same global batch as the other rows.

    python benchmarks/model_parallel.py                 # world 2, writes benchmarks/results/model_parallel.json
    python benchmarks/model_parallel.py --worlds 2 4    # also at 4 ranks
    python benchmarks/model_parallel.py --quick         # a fast smoke run
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import warnings
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # first: benchmarks/strategies.py would shadow the strategies package

from benchmarks.fsdp import Meter, MeterCallback, run_group  # noqa: E402
from trainer import Task, Trainer  # noqa: E402

RESULTS = os.path.join(ROOT, "benchmarks", "results")
VOCAB, WIDTH, HEADS, DEPTH, SEQ, BATCH = 512, 256, 8, 4, 64, 4  # BATCH: sequences per data-parallel rank
MICROBATCHES = 4
CONTENDERS = ("ddp", "zero1", "fsdp", "tp", "fsdp_tp", "pipeline")


class Block(nn.Module):
    """Pre-norm transformer block with q/k/v/o and MLP Linears that TP can split (heads split with them)."""

    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.q, self.k, self.v, self.o = (nn.Linear(WIDTH, WIDTH) for _ in range(4))
        self.fc1, self.fc2 = nn.Linear(WIDTH, 4 * WIDTH), nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        b, s, _ = h.shape
        heads = lambda t: t.view(b, s, -1, WIDTH // HEADS).transpose(1, 2)  # noqa: E731 (local heads under TP)
        a = F.scaled_dot_product_attention(
            heads(self.q(h)), heads(self.k(h)), heads(self.v(h)), is_causal=True
        )
        x = x + self.o(a.transpose(1, 2).reshape(b, s, -1))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class LMTask(Task):
    """Embedding, DEPTH blocks, a norm and the output layer; a TP/FSDP plan in configure_model (used by
    ModelParallelStrategy only) and one pipeline stage per rank."""

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

    def training_step(self, batch, batch_idx):
        tokens, targets = batch
        return self.pipeline_loss(self(tokens), targets)

    def pipeline_loss(self, output, target):
        return F.cross_entropy(output.flatten(0, 1), target.flatten())

    def configure_pipeline(self):
        n = (
            self.trainer.strategy.n_stages
        )  # DEPTH blocks cut evenly; the embedding first, norm and output last
        per = DEPTH // n
        stages = [nn.Sequential(*self.blocks[i * per : (i + 1) * per]) for i in range(n)]
        stages[0].insert(0, self.embed)
        stages[-1].extend([self.norm, self.out])
        return stages

    def configure_model(self):
        mesh = getattr(self, "device_mesh", None)
        if mesh is None or "tensor_parallel" not in (mesh.mesh_dim_names or ()):
            return  # not ModelParallelStrategy's mesh (fsdp and pipeline set their own)
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        tp, dp = mesh["tensor_parallel"], mesh["data_parallel"]
        if tp.size() > 1:
            plan = {n: ColwiseParallel() for n in ("q", "k", "v", "fc1")}
            plan.update(o=RowwiseParallel(), fc2=RowwiseParallel())
            for block in self.blocks:
                parallelize_module(block, tp, plan)
        if dp.size() > 1:
            for block in self.blocks:
                fully_shard(block, mesh=dp)
            fully_shard(self, mesh=dp)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-4)


def dataset(sequences: int) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(
        torch.randint(0, VOCAB, (sequences, SEQ), generator=g),
        torch.randint(0, VOCAB, (sequences, SEQ), generator=g),
    )


def held_bytes(task: nn.Module, optimizer: torch.optim.Optimizer, strategy: Any) -> int:
    """Bytes of this rank's parameters, gradients and optimizer state: DTensors' local shards, nothing for
    tensors on the meta device (a pipeline's other stages), ZeRO-1's own share of the state."""
    from torch.distributed.tensor import DTensor

    def size(t: torch.Tensor | None) -> int:
        if t is None:
            return 0
        t = t.to_local() if isinstance(t, DTensor) else t
        return 0 if t.is_meta else t.numel() * t.element_size()

    total = sum(size(p) + size(p.grad) for p in task.parameters())
    zero = getattr(strategy, "sharded_optimizers", None)
    if zero is not None:
        return total + zero.local_state_bytes()
    return total + sum(size(v) for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v))


class Held(MeterCallback):
    def on_before_optimizer_step(self, trainer, task, optimizer):
        self.meter.held = max(self.meter.held, held_bytes(task, optimizer, trainer.strategy))


def model_parallel_runner() -> tuple[Any, str]:
    """(a function fitting the tp / fsdp_tp contenders, '') or (None, why they are skipped). They run this
    script's task (its configure_model is the TP plan) on the same global batch as every other row."""
    try:
        from strategies.model_parallel import ModelParallelStrategy
    except ImportError as e:
        return None, f"strategies.model_parallel is not importable ({e})"

    def run(kind: str, world: int, make_task: Any, loader: DataLoader, callbacks: list[Any]) -> None:
        dp = 2 if kind == "fsdp_tp" else 1
        strategy = ModelParallelStrategy(data_parallel_size=dp, tensor_parallel_size=world // dp)
        _trainer(strategy, world, callbacks).fit(make_task(), loader)

    return run, ""


def _trainer(strategy: Any, world: int, callbacks: list[Any]) -> Trainer:
    return Trainer(
        strategy=strategy, accelerator="cpu", devices=world, max_epochs=1, callbacks=callbacks, logger=False,
        enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False, num_sanity_val_steps=0,
    )  # fmt: skip


def per_rank_batch(contender: str, world: int) -> int:
    """The same global batch (BATCH x world sequences) for every contender: each data-parallel rank's share."""
    dp = {"tp": 1, "fsdp_tp": 2, "pipeline": 1}.get(contender, world)
    return BATCH * world // dp


def fit(contender: str, world: int, steps: int, meter: Meter) -> None:
    from strategies.ddp import DDPStrategy
    from strategies.fsdp import FSDPStrategy
    from strategies.pipeline import PipelineStrategy

    size = per_rank_batch(contender, world)
    loader = DataLoader(dataset(BATCH * world * steps), batch_size=size)  # `steps` global batches
    callbacks = [Held(meter)]
    if contender in ("tp", "fsdp_tp"):
        runner, _ = model_parallel_runner()
        runner(contender, world, LMTask, loader, callbacks)
        return
    strategy = {
        "ddp": lambda: DDPStrategy(),
        "zero1": lambda: DDPStrategy(zero=1),
        "fsdp": lambda: FSDPStrategy(wrap=[Block]),
        "pipeline": lambda: PipelineStrategy(schedule="1F1B", n_microbatches=MICROBATCHES),
    }[contender]()
    _trainer(strategy, world, callbacks).fit(LMTask(), loader)


def worker(rank: int, world: int, port: int, contender: str, warmup: int, steps: int, queue: Any) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
    )  # fmt: skip
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=300))
    warnings.filterwarnings("ignore")
    meter = Meter(warmup)
    try:
        fit(contender, world, warmup + steps, meter)
        queue.put((rank, meter.result()))
    except Exception as e:  # reported as the row's reason, the other contenders still run
        queue.put((rank, {"error": f"{type(e).__name__}: {e}"}))
    dist.destroy_process_group()


def run(contender: str, world: int, warmup: int, steps: int) -> list[dict[str, Any]]:
    return run_group(worker, world, (contender, warmup, steps), contender)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--worlds", type=int, nargs="+", default=[2])
    parser.add_argument("--out", default="model_parallel.json")
    args = parser.parse_args()
    rounds, steps, warmup = (1, 3, 1) if args.quick else (args.rounds, args.steps, args.warmup)
    os.environ["MALLOC_MMAP_THRESHOLD_"] = (
        "65536"  # large blocks returned when freed: peak RSS follows tensors
    )
    load_start = os.getloadavg()[0]
    runner, why = model_parallel_runner()
    skipped = {c: why for c in ("tp", "fsdp_tp")} if runner is None else {}
    for world in args.worlds:
        if world < 4:
            skipped.setdefault(f"fsdp_tp@{world}", "fsdp x tp needs 4 ranks (dp=2 x tp=2)")
    for reason in sorted(set(skipped.values())):
        print(f"skipped ({reason}): {', '.join(c for c, r in skipped.items() if r == reason)}", flush=True)
    runs: dict[str, dict[str, list[Any]]] = {str(w): {} for w in args.worlds}
    for r in range(rounds):
        for world in args.worlds:
            order = [c for c in CONTENDERS if c not in skipped and f"{c}@{world}" not in skipped]
            for contender in order if r % 2 == 0 else order[::-1]:  # none always goes first
                result = run(contender, world, warmup, steps)
                runs[str(world)].setdefault(contender, []).append(result)
                print(f"round {r + 1}/{rounds} world {world} {contender}: {result[0]}", flush=True)
    summary: dict[str, dict[str, Any]] = {}
    for world, contenders in runs.items():
        summary[world] = {}
        for c, per_round in contenders.items():
            errors = [rank["error"] for one in per_round for rank in one if "error" in rank]
            if errors:
                summary[world][c] = {"error": errors[0]}
                continue
            summary[world][c] = {
                key: statistics.median(statistics.mean(rank[key] for rank in one) for one in per_round)
                for key in ("ms", "held_mb", "peak_mb")
            }
            summary[world][c]["held_mb_max_rank"] = statistics.median(
                max(rank["held_mb"] for rank in one) for one in per_round
            )
    params = sum(p.numel() for p in LMTask().parameters())
    out = {
        "benchmark": "model_parallel",
        "machine": {"cpu_cores": os.cpu_count(), "torch": torch.__version__, "load_average_1m": [load_start, os.getloadavg()[0]]},
        "model": {"params": params, "width": WIDTH, "heads": HEADS, "depth": DEPTH, "seq": SEQ, "vocab": VOCAB,
                  "global_batch": f"{BATCH} x world sequences", "pipeline": f"one stage per rank, 1F1B, {MICROBATCHES} micro-batches"},
        "rounds": rounds, "warmup_steps": warmup, "measured_steps": steps, "skipped": skipped,
        "summary": summary, "runs": runs,
    }  # fmt: skip
    print_table(out)
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, args.out), "w") as f:
        json.dump(out, f, indent=2)


def print_table(out: dict[str, Any]) -> None:
    print(
        f"\n{out['model']['params'] / 1e6:.2f}M parameters; median over {out['rounds']} rounds, mean over ranks"
    )
    print(
        f"{'world':>5} {'contender':<10}{'ms/step':>9}{'held MB':>9}{'max rank':>9}{'peak MB':>9}  vs ddp: time, held"
    )
    for world, s in out["summary"].items():
        base = s.get("ddp", {})
        for c, v in s.items():
            if "error" in v:
                print(f"{world:>5} {c:<10} failed: {v['error']}")
                continue
            ratio = (
                f"{v['ms'] / base['ms']:.2f}x, {v['held_mb'] / base['held_mb']:.2f}x" if "ms" in base else ""
            )
            print(
                f"{world:>5} {c:<10}{v['ms']:>9.1f}{v['held_mb']:>9.2f}{v['held_mb_max_rank']:>9.2f}"
                f"{v['peak_mb']:>9.1f}  {ratio}"
            )


if __name__ == "__main__":
    main()
