"""The checks of `make gpu-check` (benchmarks/gpu_check.py runs them): each takes a Ctx and returns a Result.

Every check compares against a reference in the same run (single device, an uninterrupted run, the fp32
gradients, the model's own size); on the CPU (`--device cpu`, the dry mode the tests run) the checks that
mean something there run on tiny models, and the CUDA-only ones say so and are skipped.
"""

from __future__ import annotations

import os
import tempfile
import traceback
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from callbacks import Callback
from trainer import Task, Trainer

QUIET = dict(logger=False, enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False,
             num_sanity_val_steps=0)  # fmt: skip


@dataclass
class Ctx:
    device: str  # "cuda" or "cpu"
    quick: bool = False
    tmp: str = field(default_factory=tempfile.mkdtemp)

    @property
    def cuda(self) -> bool:
        return self.device == "cuda"


@dataclass
class Result:
    passed: bool | None  # None: skipped (no meaning on this device)
    figure: str
    data: dict[str, Any] = field(default_factory=dict)


def skipped(why: str) -> Result:
    return Result(None, why)


class Net(Task):
    """An MLP; `spare` (a layer used at even steps only) exercises find_unused_parameters."""

    def __init__(self, width: int = 32, spare: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(16, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh())
        self.head = nn.Linear(width, 4)
        self.spare = nn.Linear(16, 4) if spare else None

    def forward(self, x: torch.Tensor, step: int = 1) -> torch.Tensor:
        out = self.head(self.body(x))
        return out + self.spare(x) if self.spare is not None and step % 2 == 0 else out

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x, batch_idx), y)
        self.log("loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x), y), prog_bar=True)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


def loader(n: int = 64, batch: int = 8, seed: int = 0) -> DataLoader:
    g = torch.Generator().manual_seed(seed)
    return DataLoader(TensorDataset(torch.randn(n, 16, generator=g), torch.randint(0, 4, (n,), generator=g)),
                      batch_size=batch)  # fmt: skip


def weights(task: nn.Module) -> dict[str, torch.Tensor]:
    out = {}
    for k, v in task.state_dict().items():
        v = v.full_tensor() if hasattr(v, "full_tensor") else v
        out[k] = v.detach().float().cpu().clone()
    return out


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], relative: bool = False) -> float:
    worst = 0.0
    for k in a:
        d = (a[k] - b[k]).abs().max().item()
        worst = max(worst, d / max(b[k].abs().max().item(), 1e-12) if relative else d)
    return worst


def fit(
    ctx: Ctx, task: Task, steps: int, ckpt_path: str | None = None, data: Any = None, **kw: Any
) -> Trainer:
    trainer = Trainer(
        accelerator=ctx.device, devices=kw.pop("devices", 1), max_steps=steps, **{**QUIET, **kw}
    )
    trainer.fit(task, data if data is not None else loader(), ckpt_path=ckpt_path)
    return trainer


# ----- the checks ------------------------------------------------------------------------------------------
def defaults(ctx: Ctx) -> Result:
    """Trainer() with no arguments runs on cuda:0 where there is a GPU."""
    t = Trainer(max_steps=2, **QUIET)
    root, expected = t.strategy.root_device, torch.device("cuda", 0) if ctx.cuda else torch.device("cpu")
    t.fit(Net(), loader(16))
    param = next(t.task.parameters()).device
    return Result(root == expected and param == expected, f"root {root}, parameters on {param}",
                  {"strategy": t.strategy.name, "precision": t.precision.name})  # fmt: skip


class SyncCounter(Callback):
    """Counts the host syncs of the steady-state steps with torch.cuda.set_sync_debug_mode (warn mode): from the
    start of batch `warmup` to the end of the last batch, inside one epoch (an epoch's start agrees on the
    loaders' lengths: once per epoch, not per step). Each sync is kept with the Python frames that made it."""

    PROTOTYPE = "prototype feature"  # torch's notice when the mode is first set: not a sync

    def __init__(self, warmup: int) -> None:
        self.warmup, self.records, self.steps, self._armed = warmup, [], 0, False
        self._shown = None

    def _show(self, message, category, filename, lineno, file=None, line=None):
        text = str(message)
        if "synchroniz" in text and self.PROTOTYPE not in text:
            frames = [f for f in traceback.extract_stack()[:-1] if "site-packages" not in f.filename]
            self.records.append(text + " at " + " <- ".join(f"{os.path.basename(f.filename)}:{f.lineno}"
                                                           for f in reversed(frames[-6:])))  # fmt: skip

    def on_train_batch_start(self, trainer, task, batch, batch_idx):
        if trainer.global_step == self.warmup and not self._armed:
            self._armed, self._shown = True, warnings.showwarning
            warnings.simplefilter("always")
            warnings.showwarning = self._show
            torch.cuda.set_sync_debug_mode("warn")
        if self._armed:
            self.steps += 1

    def on_train_end(self, trainer, task):
        if self._armed:
            torch.cuda.set_sync_debug_mode("default")
            warnings.showwarning = self._shown


def syncs(ctx: Ctx, strategy: str = "single") -> Result:
    """Host syncs per steady-state step (no logger, no bar): 0 expected."""
    if not ctx.cuda:
        return skipped("set_sync_debug_mode needs CUDA")
    counter = SyncCounter(warmup=10)
    fit(ctx, Net(), 40, strategy=strategy, callbacks=[counter], data=loader(n=8 * 41))  # one epoch
    per_step = len(counter.records) / max(counter.steps, 1)
    return Result(per_step == 0, f"{per_step:.2f} syncs/step over {counter.steps} steps ({strategy})",
                  {"first": counter.records[:4]})  # fmt: skip


def ddp1_equals_single(ctx: Ctx) -> Result:
    """ddp at one rank against single: tiny buckets, find_unused_parameters, accumulation; then bf16
    compression (within bf16's rounding)."""
    from strategies.ddp import DDPStrategy

    ref = weights(fit(ctx, Net(spare=True), 8, accumulate_grad_batches=2).task)
    figures, ok = [], True
    for hook, tol in ((None, 1e-5), ("bf16", 2e-2)):
        s = DDPStrategy(bucket_cap_mb=0.0005, find_unused_parameters=True, comm_hook=hook)
        got = weights(fit(ctx, Net(spare=True), 8, strategy=s, accumulate_grad_batches=2).task)
        d = max_diff(got, ref, relative=hook is not None)
        ok &= d <= tol
        figures.append(f"{hook or 'fp32'} max {'rel ' if hook else ''}diff {d:.1e}")
    return Result(ok, ", ".join(figures))


class LogNet(Net):
    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.log("number", 2.0, sync_dist=True)
        self.log("cpu", torch.tensor(3.0), sync_dist=True, reduce_fx="sum", on_step=False, on_epoch=True)
        self.log("loss_sync", loss, sync_dist=True, on_epoch=True)
        return loss


def sync_dist(ctx: Ctx) -> Result:
    """self.log(sync_dist=True) of a number, a CPU tensor and the loss under ddp (NCCL at one rank)."""
    t = fit(ctx, LogNet(), 4, strategy="ddp")
    m = t.callback_metrics
    ok = float(m["number"]) == 2.0 and float(m["cpu"]) == 12.0 and bool(torch.isfinite(m["loss_sync"]))
    return Result(ok, f"number {float(m['number'])}, cpu sum {float(m['cpu'])}, on {m['cpu'].device}")


def autotune(ctx: Ctx) -> Result:
    """bucket_cap_mb="auto" through its plan and trial, with its broadcasts on the group's device (NCCL on a
    GPU). At one rank the Reducer does not tune; the autotuner is attached by hand, and the cost model made to
    pick per-parameter buckets, so that the trial and its decision run."""
    import strategies.autotune as tune
    from strategies.ddp import DDPStrategy
    from strategies.reducer import AUTO_ITERATIONS

    class Tuned(DDPStrategy):
        def _build_reducer(self, task):
            super()._build_reducer(task)
            r = self.reducer
            r._tuner = tune.AutoTuner(r.process_group, r._src, 1, len(r.params), r.device, r._timer)
            r._rebuilt, r._rebuild_after = False, AUTO_ITERATIONS

    choose = tune.choose_buckets
    tune.choose_buckets = lambda ready, sizes, order, *a, **k: [[i] for i in order]
    try:
        t = fit(ctx, Net(), AUTO_ITERATIONS + tune.TRIAL_ITERATIONS + 2, strategy=Tuned(bucket_cap_mb="auto"))
    finally:
        tune.choose_buckets = choose
    a = t.strategy.reducer.auto
    ok = a is not None and a.sync_s_trial is not None and a.sync_s_trial > 0 and a.alpha_s > 0
    figure = "no decision" if a is None else (
        f"{t.strategy.comm.device}: alpha {a.alpha_s * 1e6:.1f} us, trial {a.sync_s_trial * 1e3:.2f} ms vs "
        f"{a.sync_s_cap25 * 1e3:.2f} ms, kept {'25 MB' if a.reverted else 'the chosen'} buckets"
    )  # fmt: skip
    return Result(ok, figure)


class Probe(Callback):
    """Per step: the forward output's dtype, the parameters' dtype, the gradient norm at
    on_before_optimizer_step (unscaled by then), the gradient scaler's scale."""

    def __init__(self) -> None:
        self.out, self.param, self.norms, self.scales = None, None, [], []

    def on_before_optimizer_step(self, trainer, task, optimizer):
        grads = [p.grad.float() for p in task.parameters() if p.grad is not None]
        self.norms.append(float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))))
        scaler = trainer.strategy.precision.scaler
        self.scales.append(None if scaler is None else float(scaler.get_scale()))
        self.param = next(task.parameters()).dtype


class DtypeNet(Net):
    def training_step(self, batch, batch_idx):
        x, y = batch
        out = self(x)
        self.out_dtype = out.dtype
        return F.cross_entropy(out.float(), y)


def precision_matrix(ctx: Ctx) -> Result:
    """Each precision: the compute and parameter dtypes, gradients unscaled at on_before_optimizer_step
    (their norm near fp32's), and the scaler's state through a checkpoint and a resume."""
    names = ["32-true", "bf16-mixed", "16-mixed", "bf16-true", "16-true"] + ([] if ctx.cuda else ["64-true"])
    expected = {"32-true": (torch.float32, torch.float32), "bf16-mixed": (torch.bfloat16, torch.float32),
                "16-mixed": (torch.float16, torch.float32), "bf16-true": (torch.bfloat16, torch.bfloat16),
                "16-true": (torch.float16, torch.float16), "64-true": (torch.float64, torch.float64)}  # fmt: skip
    figures, ok, ref = [], True, None
    for name in names:
        probe, task = Probe(), DtypeNet()
        t = fit(ctx, task, 3, precision=name, callbacks=[probe])
        norm = probe.norms[0]
        ref = norm if name == "32-true" else ref
        close = abs(norm - ref) <= 0.05 * ref  # type: ignore[operator]
        dtypes = (task.out_dtype, probe.param) == expected[name]
        state = ""
        if t.strategy.precision.scaler is not None:  # the scaler's scale survives a checkpoint and a resume
            t.strategy.precision.scaler.update(new_scale=1024.0)  # not the initial scale: a reset would show
            path = os.path.join(ctx.tmp, f"{name}.ckpt")
            t.save_checkpoint(path)
            again = Probe()
            fit(ctx, DtypeNet(), 4, precision=name, callbacks=[again], ckpt_path=path)
            state = f", scale 1024 -> {again.scales[0]:g} after resume"
            close &= again.scales[0] == 1024.0
        ok &= close and dtypes
        figures.append(
            f"{name}: {str(task.out_dtype)[6:]}/{str(probe.param)[6:]} |g| {norm / ref:.3f}x{state}"
        )
    return Result(ok, "; ".join(figures))
