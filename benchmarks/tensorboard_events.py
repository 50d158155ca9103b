"""What one TensorBoard logging event costs inside a fit: Tandem's TensorBoardLogger against Lightning's.

    python benchmarks/tensorboard_events.py            # 5 rounds; writes benchmarks/results/tensorboard_events.json

Why: a logging event is cheap on its own (tens of µs) but runs next to training. torch's SummaryWriter, which
Lightning's TensorBoardLogger uses, hands each event to tensorboard's writer thread; that thread opens and
closes the event file for every record and computes checksums in Python, and each system call gives the GIL
away and takes it back from the training thread. Timing `log_metrics` alone misses that, so here a fit of
`tiny` (benchmarks/overhead.py's model and task) logs at every step (log_every_n_steps=1) and the process's
CPU time, all threads, is compared with the same fit without a logger. Contenders, in alternating order each
round: `none` (logger=False), `tandem` (TensorBoardLogger: one event per step, written in the training
thread), `lightning` (pytorch_lightning's TensorBoardLogger behind Tandem's Logger interface, when installed:
SummaryWriter.add_scalar per metric). A contender's cost per event is (CPU over 2,400 steps - over 400) / 2,000
minus `none`'s, so setup cancels; the median over rounds is printed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # first: benchmarks/ (a script's sys.path[0]) holds a strategies.py

import torch  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from benchmarks.overhead_models import TinyNet, wrapped  # noqa: E402
from trainer import Task, Trainer  # noqa: E402
from trainer.loggers.base import Logger  # noqa: E402

SHORT, LONG = 400, 2400


class LightningTensorBoard(Logger):
    """pytorch_lightning's TensorBoardLogger, driven through Tandem's Logger interface."""

    def __init__(self, save_dir: str) -> None:
        super().__init__(save_dir, "lightning_logs", 0)
        from pytorch_lightning.loggers import TensorBoardLogger

        self.inner = TensorBoardLogger(save_dir, name="lightning_logs", version=0)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.inner.log_metrics(metrics, step)

    def log_hyperparams(self, params: dict[str, Any], metrics: dict[str, float] | None = None) -> None:
        self.inner.log_hyperparams(params, metrics)

    def finalize(self, status: str) -> None:
        self.inner.finalize(status)


def fit(steps: int, logger: str) -> float:
    """CPU seconds of the whole process for a fit of `steps` steps that logs every step to `logger`."""
    g = torch.Generator().manual_seed(0)
    batches = [TinyNet.batch(g) for _ in range(8)]
    with tempfile.TemporaryDirectory() as tmp:
        chosen: Any = {"none": False, "tandem": True, "lightning": lambda: LightningTensorBoard(tmp)}[logger]
        trainer = Trainer(
            max_epochs=1, accelerator="cpu", default_root_dir=tmp, log_every_n_steps=1,
            logger=chosen() if callable(chosen) else chosen,
            enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False,
        )  # fmt: skip
        loader = DataLoader(batches * (steps // 8), batch_size=None)
        start = time.process_time()
        with open(os.devnull, "w") as devnull, contextlib.redirect_stderr(devnull):
            trainer.fit(wrapped(Task, TinyNet()), train_dataloaders=loader)
        return time.process_time() - start


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "tensorboard_events.json"))
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    try:
        import pytorch_lightning  # noqa: F401

        names = ["none", "tandem", "lightning"]
    except ImportError:
        print("PyTorch Lightning not installed: its logger is not measured (`make bench` installs it).")
        names = ["none", "tandem"]
    for name in names:  # warm-up: imports and first-use costs out of the rounds
        fit(SHORT, name)
    per_step: dict[str, list[float]] = {n: [] for n in names}
    for r in range(args.rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            per_step[name].append((fit(LONG, name) - fit(SHORT, name)) / (LONG - SHORT))
    base = statistics.median(per_step["none"])
    result = {n: 1e6 * (statistics.median(v) - base) for n, v in per_step.items() if n != "none"}
    print(f"CPU per step without a logger: {1e6 * base:.0f} µs (median of {args.rounds} rounds)")
    for name, us in result.items():
        print(f"{name:<10} {us:7.0f} µs of CPU per logging event inside the fit")
    if "lightning" in result and result["tandem"] > 0:
        print(f"lightning / tandem: {result['lightning'] / result['tandem']:.1f}x")
    report = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "torch": torch.__version__,
        "rounds": args.rounds,
        "us_per_event": result,
        "cpu_us_per_step": {n: [1e6 * x for x in v] for n, v in per_step.items()},
    }
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    print(f"wrote {os.path.relpath(args.out)}")
    return report


if __name__ == "__main__":
    main()
