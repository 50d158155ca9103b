"""Writes checkpoints of ~40 MB to PATH in a loop (atomically, or plainly with --plain), printing each
finished generation; tests SIGKILL it at random moments and check what is left on disk."""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from strategies.checkpoint.checks import FORMAT_VERSION  # noqa: E402
from trainer.checkpoint import atomic_save  # noqa: E402

path, plain = sys.argv[1], "--plain" in sys.argv
start = int(os.environ.get("GENERATION", "0"))
weights = torch.randn(10_000_000)
for generation in range(start, start + 1000):
    obj = {"tandem_version": FORMAT_VERSION, "state_dict": {"w": weights}, "epoch": 0, "global_step": 0}
    obj["generation"] = generation
    if plain:
        torch.save(obj, path)
    else:
        atomic_save(obj, path)
    print(generation, flush=True)
