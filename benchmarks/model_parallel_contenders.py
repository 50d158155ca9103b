"""Tensor-parallel and FSDP x TP contenders (Tandem's ModelParallelStrategy) and a DDP baseline, on one small
transformer LM, each in fresh gloo processes on the CPU. benchmarks/model_parallel.py imports
`run_model_parallel`; run alone, this module prints a table:

    python benchmarks/model_parallel_contenders.py [--rounds 3] [--steps 6]

API: ``run_model_parallel(mode, world, steps=6, warmup=2) -> list[dict]``, one dict per rank with "ms" (median
ms per step after the warm-up), "held_mb" (this rank's parameters, gradients and optimizer state, counted
tensor by tensor) and "peak_mb" (peak RSS during the measured steps over the RSS after training; see
benchmarks/fsdp.py). `mode`: "tp" (mesh 1 x world), "fsdp_tp" (2 x world/2: FSDP on dim 0, TP on dim 1) or
"ddp" (Tandem's DDPStrategy, the same model unsplit). Every rank gets BATCH sequences per step under ddp; under
tp and fsdp_tp every data-parallel rank does (so the global batch is BATCH x dp: TP ranks share a batch).
"""

from __future__ import annotations

import argparse
import math
import os
import queue as queue_module
import statistics
import sys
import warnings
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # first: benchmarks/strategies.py would shadow the strategies package

from benchmarks.fsdp import Meter, MeterCallback  # noqa: E402
from strategies.ddp import DDPStrategy  # noqa: E402
from strategies.launch import _free_port  # noqa: E402
from strategies.model_parallel import ModelParallelStrategy  # noqa: E402
from trainer import Task, Trainer  # noqa: E402

VOCAB, WIDTH, HEADS, DEPTH, SEQ, BATCH = 1024, 256, 8, 4, 64, 4
MODES = ("ddp", "tp", "fsdp_tp")


class Attention(nn.Module):
    """Heads from plain Linear layers; runs on whatever heads this rank's q/k/v hold (all, or 1/tp)."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(WIDTH, WIDTH) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.q(x), self.k(x), self.v(x)
        b, t, width = q.shape
        hd = WIDTH // HEADS
        q, k, v = (z.reshape(b, t, width // hd, hd).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # local tensors: fine on CPU
        return self.o(y.transpose(1, 2).reshape(b, t, width))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.attn, self.norm2 = nn.LayerNorm(WIDTH), Attention(), nn.LayerNorm(WIDTH)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class LMTask(Task):
    """Embedding, DEPTH blocks, norm, output layer (3.7M parameters); configure_model splits it on the
    mesh when there is one (TP on every block's attention and MLP, FSDP per block when dp > 1)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(DEPTH))
        self.norm, self.out = nn.LayerNorm(WIDTH), nn.Linear(WIDTH, VOCAB)

    def configure_model(self) -> None:
        mesh = self.device_mesh
        if mesh is None or mesh.mesh_dim_names != ("data_parallel", "tensor_parallel"):
            return  # ddp: nothing to split
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor import Replicate
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        tp, dp = mesh["tensor_parallel"], mesh["data_parallel"]
        plan = {
            "attn.q": ColwiseParallel(),
            "attn.k": ColwiseParallel(),
            "attn.v": ColwiseParallel(),
            "attn.o": RowwiseParallel(),
            "mlp.0": ColwiseParallel(),
            "mlp.2": RowwiseParallel(),
        }
        for block in self.blocks:
            parallelize_module(block, tp, plan)
        parallelize_module(self.out, tp, ColwiseParallel(output_layouts=Replicate()))
        if dp.size() > 1:
            for block in self.blocks:
                fully_shard(block, mesh=dp)
            fully_shard(self, mesh=dp)

    def training_step(self, batch, batch_idx):
        tokens, targets = batch
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return F.cross_entropy(self.out(self.norm(x)).flatten(0, 1), targets.flatten())

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-4)


def _dataset(n: int) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(
        torch.randint(0, VOCAB, (n, SEQ), generator=g), torch.randint(0, VOCAB, (n, SEQ), generator=g)
    )


def _train(mode: str, world: int, steps: int, meter: Meter) -> None:
    if mode == "ddp":
        strategy, dp = DDPStrategy(), world
    else:
        dp = 1 if mode == "tp" else 2
        strategy = ModelParallelStrategy(data_parallel_size=dp, tensor_parallel_size=world // dp)
    trainer = Trainer(
        strategy=strategy, accelerator="cpu", devices=world, max_steps=steps, callbacks=[MeterCallback(meter)],
        logger=False, enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False,
        num_sanity_val_steps=0,
    )  # fmt: skip
    trainer.fit(LMTask(), DataLoader(_dataset(dp * BATCH * steps), batch_size=BATCH))


def _worker(rank: int, world: int, port: int, mode: str, warmup: int, steps: int, queue: Any) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
    )  # fmt: skip
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    meter = Meter(warmup)
    _train(mode, world, warmup + steps, meter)
    queue.put((rank, meter.result()))
    dist.destroy_process_group()


def run_model_parallel(mode: str, world: int, steps: int = 6, warmup: int = 2) -> list[dict[str, float]]:
    """One fresh group of `world` processes training LMTask under `mode` ("ddp", "tp", "fsdp_tp");
    the per-rank {"ms", "held_mb", "peak_mb"}."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if mode == "fsdp_tp" and (world < 4 or world % 2):
        raise ValueError("fsdp_tp needs an even world size of at least 4 (a 2 x world/2 mesh)")
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", "65536")  # peak RSS follows the tensors (see fsdp.py)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(target=_worker, args=(r, world, port, mode, warmup, steps, queue)) for r in range(world)
    ]
    for p in procs:
        p.start()
    results: dict[int, dict[str, float]] = {}
    while len(results) < world:
        try:
            rank, result = queue.get(timeout=5)
            results[rank] = result
        except queue_module.Empty:
            failed = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if failed:
                for p in procs:
                    p.kill()
                raise RuntimeError(f"{mode} at world {world}: a worker exited with {failed[0]}") from None
    for p in procs:
        p.join()
    return [results[r] for r in range(world)]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args()
    cases = [("ddp", 2), ("tp", 2), ("ddp", 4), ("tp", 4), ("fsdp_tp", 4)]
    runs: dict[str, list[list[dict[str, float]]]] = {f"{m}@{w}": [] for m, w in cases}
    load = [os.getloadavg()[0]]
    for r in range(args.rounds):
        for mode, world in cases if r % 2 == 0 else cases[::-1]:
            runs[f"{mode}@{world}"].append(run_model_parallel(mode, world, args.steps, args.warmup))
            print(f"round {r + 1} {mode}@{world}: {runs[f'{mode}@{world}'][-1]}", flush=True)
    load.append(os.getloadavg()[0])
    params = sum(p.numel() for p in LMTask().parameters())
    print(f"\nLMTask: {params / 1e6:.2f}M parameters, {math.prod((BATCH, SEQ))} tokens per dp rank per step; "
          f"torch {torch.__version__}, {os.cpu_count()} cores, load {load[0]:.1f} -> {load[1]:.1f}")  # fmt: skip
    print(f"{'case':<12}{'ms/step':>9}{'held MB/rank':>14}{'max held':>10}{'peak MB/rank':>14}")
    for case, per_round in runs.items():
        med = {
            k: statistics.median(statistics.mean(rank[k] for rank in one) for one in per_round)
            for k in ("ms", "held_mb", "peak_mb")
        }
        top = statistics.median(max(rank["held_mb"] for rank in one) for one in per_round)
        print(f"{case:<12}{med['ms']:>9.1f}{med['held_mb']:>14.2f}{top:>10.2f}{med['peak_mb']:>14.1f}")


if __name__ == "__main__":
    main()
