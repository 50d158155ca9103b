"""More checks of `make gpu-check`: the other strategies at one device, compile, the throughput peak, fork with
CUDA, checkpoints across devices, exact resume, FSDP's memory (benchmarks/gpu_check.py runs them)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import torch
import torch.nn.functional as F
from gpu_checks import QUIET, Ctx, Net, Result, fit, loader, max_diff, skipped, weights
from torch import nn

from callbacks import Callback, ModelCheckpoint
from trainer import Task, Trainer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def dp_two_replicas(ctx: Ctx) -> Result:
    """strategy='dp' with two replicas on one device against single on the same batches."""
    from strategies.data_parallel import DataParallelStrategy

    ref = weights(fit(ctx, Net(), 6).task)
    dp = DataParallelStrategy(accelerator=ctx.device, devices=1)
    dev = torch.device(ctx.device, 0) if ctx.cuda else torch.device("cpu")
    dp._device_list = [dev, dev]  # two replicas, one device
    got = weights(fit(ctx, Net(), 6, strategy=dp).task)
    d = max_diff(got, ref)
    return Result(d <= 1e-5, f"max diff {d:.1e} against single ({dp.stats['steps']:g} split steps)")


class TPNet(Net):
    """Net with its two hidden layers tensor-parallel (Colwise then Rowwise) on the mesh's tp dimension."""

    def configure_model(self) -> None:
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        parallelize_module(
            self.body, self.device_mesh["tensor_parallel"], {"0": ColwiseParallel(), "2": RowwiseParallel()}
        )
        fully_shard(
            self, mesh=self.device_mesh["data_parallel"]
        )  # the documented recipe: every parameter a DTensor


class StopAt(Callback):
    def __init__(self, step: int, path: str) -> None:
        self.step, self.path = step, path

    def on_train_batch_end(self, trainer, task, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            trainer.save_checkpoint(self.path)


def _resumed(ctx: Ctx, make, strategy, name: str, **kw) -> tuple[float, int]:
    """(max diff of a run resumed from step 3 against the uninterrupted 6-step run, the resumed start step)."""
    path = os.path.join(ctx.tmp, name)
    whole = weights(fit(ctx, make(), 6, strategy=strategy(), callbacks=[StopAt(3, path)], **kw).task)
    resumed = fit(ctx, make(), 6, strategy=strategy(), ckpt_path=path, **kw)
    return max_diff(weights(resumed.task), whole), 3


def model_parallel_and_pipeline(ctx: Ctx) -> Result:
    """model_parallel (1, 1) under bf16-mixed and pipeline(1) under bf16-true, with clipping, saved (DCP) at
    step 3 and resumed: equal to the uninterrupted run."""
    from strategies.model_parallel import ModelParallelStrategy
    from strategies.pipeline import PipelineStrategy

    mp, _ = _resumed(
        ctx, TPNet, lambda: ModelParallelStrategy(1, 1), "mp", precision="bf16-mixed", gradient_clip_val=0.1
    )
    pp, _ = _resumed(ctx, PipeNet, PipelineStrategy, "pp", precision="bf16-true", gradient_clip_val=0.1)
    return Result(mp <= 1e-6 and pp <= 1e-6, f"model_parallel resumed max diff {mp:.1e}, pipeline {pp:.1e}")


class PipeNet(Net):
    def configure_pipeline(self):
        return [nn.Sequential(self.body, self.head)]

    def pipeline_loss(self, output, target):
        return F.cross_entropy(output.float(), target)


def compiled(ctx: Ctx) -> Result:
    """compile (default, and reduce-overhead: CUDA graphs) over 2 epochs with validation, the progress bar and a
    checkpoint; on the CPU the eager backend only (inductor's C++ build takes minutes here)."""
    modes = [{"mode": "default"}, {"mode": "reduce-overhead"}] if ctx.cuda else [{"backend": "eager"}]
    figures, ok = [], True
    for options in modes:
        ckpt = ModelCheckpoint(dirpath=os.path.join(ctx.tmp, f"compile-{len(figures)}"), monitor="val_loss")
        t = Trainer(accelerator=ctx.device, devices=1, max_epochs=2, compile=options, enable_progress_bar=True,
                    callbacks=[ckpt], logger=False, enable_model_summary=False, limit_val_batches=2)  # fmt: skip
        t.fit(Net(), loader(32), loader(16))
        val = float(t.callback_metrics["val_loss"])
        done = t.global_step == 8 and val == val and os.path.isfile(ckpt.best_model_path)
        ok &= done
        figures.append(
            f"{options}: {t.global_step} steps, val_loss {val:.3f}, checkpoint {'ok' if done else 'missing'}"
        )
    return Result(ok, "; ".join(figures))


def throughput_peak(ctx: Ctx) -> Result:
    """ThroughputMonitor's peak FLOP/s for this GPU under bf16-mixed (the chip table knows it)."""
    if not ctx.cuda:
        return skipped("no GPU: no peak")
    from callbacks import ThroughputMonitor

    cb = ThroughputMonitor(batch_size_fn=lambda b: b[0].shape[0])
    t = Trainer(precision="bf16-mixed", callbacks=[cb], max_steps=1, **QUIET)
    cb.setup(t, Net(), "fit")
    name = torch.cuda.get_device_name(0)
    peak = cb.available_flops
    return Result(peak is not None, f"{name}: {peak / 1e12 if peak else 0:.1f} TFLOP/s bf16")


_FORK = """
import os, torch
from torch.utils.data import DataLoader, TensorDataset
from tandem_core.errors import ConfigError
from trainer import Trainer
from gpu_checks import Net, QUIET, loader
t = Trainer(accelerator="cuda", devices=1, strategy="ddp_fork", max_steps=2, **QUIET)
assert not torch.cuda.is_initialized(), "Trainer() initialized CUDA"
pid = os.fork()
if pid == 0:  # a forked child uses the GPU the parent never touched
    try:
        Trainer(accelerator="cuda", devices=1, max_steps=2, **QUIET).fit(Net(), loader(16))
        os._exit(0)
    except BaseException as e:
        print("child failed:", e); os._exit(1)
_, status = os.waitpid(pid, 0)
assert status == 0, "the forked child could not train on the GPU"
torch.zeros(1, device="cuda")  # now the parent has initialized CUDA: forking workers must be refused
try:
    Trainer(accelerator="cpu", devices=2, strategy="ddp_fork", max_steps=1, **QUIET).fit(Net(), loader(16))
    raise SystemExit("ddp_fork forked after CUDA was initialized")
except ConfigError as e:
    print("refused:", str(e)[:60])
"""


def fork_with_cuda(ctx: Ctx) -> Result:
    """Trainer() leaves CUDA uninitialized (a forked child trains on the GPU), and ddp_fork refuses a parent
    that initialized it, before any worker starts."""
    if not ctx.cuda:
        return skipped("needs CUDA")
    paths = [ROOT, os.path.join(ROOT, "benchmarks"), os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in paths if p))
    p = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_FORK)], capture_output=True, text=True, env=env, timeout=120
    )
    lines = (p.stdout + p.stderr).strip().splitlines()
    said = [
        line for line in lines if line.startswith(("refused:", "child failed:"))
    ]  # (not torch's warnings)
    return Result(p.returncode == 0, (said or lines or [f"exit {p.returncode}"])[-1])


def save_load(ctx: Ctx) -> Result:
    """A checkpoint saved on this device loads on the CPU and here (load_from_checkpoint), weights equal."""
    t = fit(ctx, Net(), 3)
    path = os.path.join(ctx.tmp, "saved.ckpt")
    t.save_checkpoint(path)
    ref = weights(t.task)
    on_cpu = Net.load_from_checkpoint(path, map_location="cpu")
    here = Net.load_from_checkpoint(path, map_location=ctx.device)
    devices = {str(next(m.parameters()).device) for m in (on_cpu, here)}
    d = max(max_diff(weights(on_cpu), ref), max_diff(weights(here), ref))
    return Result(d == 0.0, f"max diff {d:.1e}, loaded on {sorted(devices)}")


def exact_resume(ctx: Ctx) -> Result:
    """deterministic=True: stopped mid-epoch at step 3 (of 8 per epoch), resumed: bit-identical to the run
    that went through, after 2 epochs."""
    path = os.path.join(ctx.tmp, "mid.ckpt")
    kw = dict(deterministic=True, max_epochs=2)
    whole = weights(fit(ctx, Net(), -1, callbacks=[StopAt(3, path)], **kw).task)
    resumed = fit(ctx, Net(), -1, ckpt_path=path, **kw)
    d = max_diff(weights(resumed.task), whole)
    return Result(d == 0.0, f"max diff {d:.1e} after {resumed.global_step} steps")


def fsdp_memory(ctx: Ctx) -> Result:
    """GPU memory held after FSDP's setup (world size 1: the whole model) against the model's own bytes."""
    if not ctx.cuda:
        return skipped("needs CUDA memory statistics")

    class Big(Net):
        def __init__(self) -> None:
            super().__init__(width=2048)

    class AtStart(Callback):
        def on_train_start(self, trainer, task):
            self.allocated = torch.cuda.memory_allocated()

    probe = AtStart()
    torch.cuda.reset_peak_memory_stats()
    t = fit(ctx, Big(), 1, strategy="fsdp", callbacks=[probe])
    size = sum(p.numel() * p.element_size() for p in t.task.parameters())
    ratio, peak = probe.allocated / size, torch.cuda.max_memory_allocated() / size
    return Result(
        ratio <= 1.5, f"after setup {ratio:.2f}x the model ({size / 2**20:.0f} MiB), peak {peak:.2f}x"
    )


class Tokens(Task):
    """A small decoder-only transformer (language modelling on random tokens)."""

    def __init__(self, vocab: int, d: int, layers: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(vocab, d)
        layer = nn.TransformerEncoderLayer(d, 8, 4 * d, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers)
        self.out = nn.Linear(d, vocab)

    def forward(self, x):
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1], device=x.device)
        return self.out(self.blocks(self.emb(x), mask=mask, is_causal=True))

    def training_step(self, batch, batch_idx):
        x = batch[0]
        return F.cross_entropy(self(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=3e-4)
