"""The tokens/s check of `make gpu-check`: one small transformer, single device, bf16-mixed, with and without
torch.compile, trained by Tandem, by Lightning and by a hand-written torch loop in the same process, one after
the other, each timed over the same steady-state steps (after warm-up and compilation)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from gpu_checks import QUIET, Ctx, Result
from gpu_checks_models import Tokens
from torch.utils.data import DataLoader, TensorDataset

from callbacks import Callback
from trainer import Trainer

WARMUP = 5


def _sizes(ctx: Ctx) -> dict[str, int]:
    if ctx.cuda and not ctx.quick:
        return dict(vocab=8192, d=256, layers=4, seq=256, batch=16, steps=40)
    return dict(vocab=64, d=16, layers=1, seq=8, batch=4, steps=4)


def _sync(ctx: Ctx) -> None:
    if ctx.cuda:
        torch.cuda.synchronize()


def _data(s: dict[str, int]) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(
        torch.randint(0, s["vocab"], ((WARMUP + s["steps"]) * s["batch"], s["seq"] + 1), generator=g)
    )


def _torch_loop(ctx: Ctx, s: dict[str, int], compile: bool) -> float:
    """Seconds of the measured steps in the loop a user writes by hand."""
    model = Tokens(s["vocab"], s["d"], s["layers"]).to(ctx.device)
    step_model = torch.compile(model) if compile else model
    opt = model.configure_optimizers()
    start = 0.0
    for i, (x,) in enumerate(DataLoader(_data(s), batch_size=s["batch"])):
        if i == WARMUP:
            _sync(ctx)
            start = time.perf_counter()
        x = x.to(ctx.device, non_blocking=True)
        with torch.autocast(ctx.device, dtype=torch.bfloat16):
            loss = F.cross_entropy(step_model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    _sync(ctx)
    return time.perf_counter() - start


class _Clock:
    """Marks the start of step WARMUP and the end of training (after a device sync)."""

    def __init__(self, ctx: Ctx) -> None:
        self.ctx, self.start, self.end = ctx, 0.0, 0.0

    def on_train_batch_start(self, trainer: Any, task: Any, batch: Any, batch_idx: int) -> None:
        if batch_idx == WARMUP:
            _sync(self.ctx)
            self.start = time.perf_counter()

    def on_train_end(self, trainer: Any, task: Any) -> None:
        _sync(self.ctx)
        self.end = time.perf_counter()


def _tandem(ctx: Ctx, s: dict[str, int], compile: bool) -> float:
    class Clock(_Clock, Callback):
        pass

    clock = Clock(ctx)
    t = Trainer(accelerator=ctx.device, devices=1, precision="bf16-mixed", compile=compile, callbacks=[clock],
                max_steps=WARMUP + s["steps"], **QUIET)  # fmt: skip
    t.fit(Tokens(s["vocab"], s["d"], s["layers"]), DataLoader(_data(s), batch_size=s["batch"]))
    return clock.end - clock.start


def _lightning(ctx: Ctx, s: dict[str, int], compile: bool) -> float:
    import pytorch_lightning as pl

    class Clock(_Clock, pl.Callback):
        pass

    class Lit(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = Tokens(s["vocab"], s["d"], s["layers"])

        def training_step(self, batch, batch_idx):
            return self.net.training_step(batch, batch_idx)

        def configure_optimizers(self):
            return self.net.configure_optimizers()

    clock = Clock(ctx)
    module = Lit()
    t = pl.Trainer(accelerator="gpu" if ctx.cuda else "cpu", devices=1, precision="bf16-mixed", callbacks=[clock],
                   max_steps=WARMUP + s["steps"], **QUIET)  # fmt: skip
    t.fit(torch.compile(module) if compile else module, DataLoader(_data(s), batch_size=s["batch"]))
    return clock.end - clock.start


def tokens_per_s(ctx: Ctx) -> Result:
    """Tokens/s of Tandem, Lightning and a hand-written loop (bf16-mixed; eager, then compiled on a GPU)."""
    s = _sizes(ctx)
    tokens = s["batch"] * s["seq"] * s["steps"]
    runners: dict[str, Callable[[Ctx, dict[str, int], bool], float]] = {
        "torch": _torch_loop,
        "tandem": _tandem,
    }
    try:
        import pytorch_lightning  # noqa: F401

        runners["lightning"] = _lightning
    except ImportError:
        pass
    data: dict[str, float] = {}
    figures = []
    for compile in (False, True) if ctx.cuda else (False,):
        rates = {name: tokens / run(ctx, s, compile) for name, run in runners.items()}
        data.update({f"{name}{'+compile' if compile else ''}": r for name, r in rates.items()})
        ratios = ", ".join(f"{n} {r / rates['torch']:.2f}x" for n, r in rates.items() if n != "torch")
        figures.append(f"{'compiled' if compile else 'eager'}: torch {rates['torch']:,.0f} tok/s, {ratios}")
    if "lightning" not in runners:
        figures.append("Lightning not installed")
    ok = all(v > 0 for v in data.values())
    return Result(ok, "; ".join(figures), data)
