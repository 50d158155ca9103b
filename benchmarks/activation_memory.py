"""Activation checkpointing, side by side: the peak memory and the time of one training step (forward, backward)
of a transformer on long sequences, without checkpointing, with full checkpointing of every block, and with
selective checkpointing (the linear layers' outputs kept; attention, norms and activations recomputed), all three
in one run.

The peak is what torch's CPU allocator held at once during the step (counted at the allocator:
strategies/memory/measure.py), minus what it held before (the weights); also the parameters' and the
gradients' bytes, to read the activations off. Times are medians over rounds, the contenders interleaved.

    python benchmarks/activation_memory.py            # writes benchmarks/results/activation_memory.json
    python benchmarks/activation_memory.py --quick    # a small model, in seconds: activation_memory_quick.json
    python benchmarks/activation_memory.py --layers 4 --seq 1024   # another size: activation_memory_<size>.json
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from strategies.large.activation import checkpoint_modules  # noqa: E402
from strategies.memory.measure import allocation_peak  # noqa: E402
from tests.helpers.plan_models import GPT, Block  # noqa: E402

SAVE = ["aten.mm", "aten.addmm"]  # selective: the linear layers' outputs are kept; attention is recomputed


def step(model: GPT, x: torch.Tensor, y: torch.Tensor) -> None:
    model.training_step((x, y), 0).backward()
    model.zero_grad(set_to_none=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--d", type=int, default=None, help="width (full size: 256)")
    ap.add_argument("--layers", type=int, default=None, help="blocks (full size: 6)")
    ap.add_argument("--seq", type=int, default=None, help="tokens per sequence (full size: 2048)")
    ap.add_argument("--batch", type=int, default=None, help="sequences (full size: 2)")
    ap.add_argument("--rounds", type=int, default=None, help="timed steps per contender (full size: 3)")
    args = ap.parse_args()
    full = (256, 6, 2048, 2, 3)
    d, layers, seq, batch, rounds = (128, 2, 512, 1, 2) if args.quick else full
    d, layers, seq, batch, rounds = (
        d if args.d is None else args.d,
        layers if args.layers is None else args.layers,
        seq if args.seq is None else args.seq,
        batch if args.batch is None else args.batch,
        rounds if args.rounds is None else args.rounds,
    )
    load_start = os.getloadavg()  # (the machine's other work: the step times depend on it)
    torch.manual_seed(0)
    torch.set_num_threads(2)
    plain = GPT(d=d, heads=8, layers=layers, vocab=1000)
    models = {"none": plain, "full": copy.deepcopy(plain), "selective": copy.deepcopy(plain)}
    checkpoint_modules(models["full"], {Block})
    checkpoint_modules(models["selective"], {Block}, save_ops=SAVE)
    x = torch.randint(0, 1000, (batch, seq))
    y = torch.roll(x, -1, dims=1)
    params = sum(p.numel() * p.element_size() for p in plain.parameters())
    peaks, times = {}, {k: [] for k in models}
    for name, model in models.items():
        step(model, x, y)  # warm up
        with allocation_peak() as peak:
            step(model, x, y)
        peaks[name] = peak.bytes
        print(f"{name}: peak {peak.bytes / 2**20:.1f} MB", flush=True)
    for _ in range(rounds):
        for name, model in models.items():
            start = time.perf_counter()
            step(model, x, y)
            times[name].append(time.perf_counter() - start)
    rows = {
        name: {
            "peak_mb": peaks[name] / 2**20,
            "activations_mb": max(peaks[name] - params, 0) / 2**20,  # the gradients (= params) are part of it
            "peak_vs_none": peaks[name] / peaks["none"],
            "step_s": statistics.median(times[name]),
            "time_vs_none": statistics.median(times[name]) / statistics.median(times["none"]),
            "step_s_rounds": times[name],  # each round's time, the contenders interleaved
        }
        for name in models
    }
    print(
        f"transformer d={d}, {layers} blocks, {batch} x {seq} tokens, {params / 2**20:.1f} MB of weights; "
        "one step's peak of torch's allocator (the weights not counted, the gradients counted), its time (median)"
    )
    print(f"{'checkpointing':<13} {'peak MB':>9} {'x none':>7} {'step s':>8} {'x none':>7}")
    for name, r in rows.items():
        print(
            f"{name:<13} {r['peak_mb']:>9.1f} {r['peak_vs_none']:>7.2f} {r['step_s']:>8.3f} "
            f"{r['time_vs_none']:>7.2f}"
        )
    # --quick writes a file of its own (a small model: its peaks hold, its times are too short to compare)
    size = (d, layers, seq, batch)
    name = (
        "activation_memory_quick.json"
        if args.quick and size == (128, 2, 512, 1)
        else "activation_memory.json"
        if size == full[:4]
        else f"activation_memory_d{d}_l{layers}_s{seq}_b{batch}.json"
    )
    out = os.path.join(ROOT, "benchmarks", "results", name)
    config = {
        "d": d,
        "layers": layers,
        "seq": seq,
        "batch": batch,
        "rounds": rounds,
        "save_ops": SAVE,
        "loadavg_start": load_start,
        "loadavg_end": os.getloadavg(),
        "torch": torch.__version__,
    }
    with open(out, "w") as f:
        json.dump({"config": config, "results": rows}, f, indent=1)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
