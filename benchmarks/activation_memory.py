"""Activation checkpointing, side by side: the peak memory and the time of one training step (forward, backward)
of a transformer on long sequences, without checkpointing, with full checkpointing of every block, and with
selective checkpointing (the linear layers' outputs kept; attention, norms and activations recomputed), all three
in one run.

The peak is what torch's CPU allocator held at once during the step (counted at the allocator:
strategies/memory/measure.py), minus what it held before (the weights); also the parameters' and the
gradients' bytes, to read the activations off. Times are medians over rounds, the contenders interleaved.

    python benchmarks/activation_memory.py            # writes benchmarks/results/activation_memory.json
    python benchmarks/activation_memory.py --quick    # a small model, in seconds: activation_memory_quick.json
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
    args = ap.parse_args()
    d, layers, seq, batch, rounds = (128, 2, 512, 1, 2) if args.quick else (256, 6, 2048, 2, 3)
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
    name = "activation_memory_quick.json" if args.quick else "activation_memory.json"
    out = os.path.join(ROOT, "benchmarks", "results", name)
    config = {
        "d": d,
        "layers": layers,
        "seq": seq,
        "batch": batch,
        "save_ops": SAVE,
        "torch": torch.__version__,
    }
    with open(out, "w") as f:
        json.dump({"config": config, "results": rows}, f, indent=1)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
