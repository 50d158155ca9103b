"""The models and contenders of benchmarks/overhead.py: Lightning's parity models, a raw loop, Tandem, Lightning."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader


# ----- the models: PyTorch Lightning's parity-benchmark models, written out here ------------------------
class LSTMNet(torch.nn.Module):
    """LSTM 10 -> 20 over sequences of 100 steps, then Linear 20 -> 5 at every step; MSE loss."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn = torch.nn.LSTM(10, 20, batch_first=True)
        self.head = torch.nn.Linear(20, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(x)[0])

    @staticmethod
    def loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(out, y)

    @staticmethod
    def batch(g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(30, 100, 10, generator=g), torch.randn(30, 100, 5, generator=g)


class MLPNet(torch.nn.Module):
    """784 -> 128, tanh, BatchNorm, dropout, -> 10; cross-entropy loss."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(784, 128),
            torch.nn.Tanh(),
            torch.nn.BatchNorm1d(128),
            torch.nn.Dropout(0.3),
            torch.nn.Linear(128, 10),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    @staticmethod
    def loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(out, y)

    @staticmethod
    def batch(g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(128, 784, generator=g), torch.randint(0, 10, (128,), generator=g)


class TinyNet(torch.nn.Module):
    """Linear 16 -> 1 on batches of 8: a step that costs almost nothing, so the framework's fixed cost shows."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)

    @staticmethod
    def loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(out, y)

    @staticmethod
    def batch(g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(8, 16, generator=g), torch.randn(8, 1, generator=g)


MODELS: dict[str, type[torch.nn.Module]] = {"lstm": LSTMNet, "mlp": MLPNet, "tiny": TinyNet}
LR = 0.02


def make_optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    """The same optimizer for every contender."""
    return torch.optim.Adam(model.parameters(), lr=LR)


# ----- the contenders: each trains on a DataLoader until it runs out ----------------------------------
def run_raw(model: torch.nn.Module, loader: DataLoader, workdir: str) -> None:
    """The hand-written loop: forward, loss, backward, step, zero_grad."""
    opt = make_optimizer(model)
    model.train()
    for x, y in loader:
        loss = model.loss(model(x), y)  # type: ignore[operator]
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def run_raw_closure(model: torch.nn.Module, loader: DataLoader, workdir: str) -> None:
    """The raw loop through ``opt.step(closure)``, as Lightning's contract runs a step (--ablation)."""
    opt = make_optimizer(model)
    model.train()
    for x, y in loader:

        def closure(x: torch.Tensor = x, y: torch.Tensor = y) -> torch.Tensor:
            opt.zero_grad(set_to_none=True)
            loss = model.loss(model(x), y)  # type: ignore[operator]
            loss.backward()
            return loss

        opt.step(closure)


class _FloorTask(torch.nn.Module):
    """The floor's task base: `self.log` keeps the detached value in a dict, and that is all."""

    def __init__(self) -> None:
        super().__init__()
        self.metrics: dict[str, torch.Tensor] = {}

    def log(self, name: str, value: torch.Tensor, **_: Any) -> None:
        self.metrics[name] = value.detach()


def run_floor(
    model: torch.nn.Module,
    loader: DataLoader,
    workdir: str,
    min_interval_s: float = 0.1,
    lookups: bool = True,
) -> None:
    """(--ablation) The least Python any trainer runs per step to keep Lightning's per-step contract with
    logging and a progress bar on: the raw closure loop, plus the task's training_step called as a method
    (the same task code as the other contenders, two `self.model` lookups included), a `self.log` that keeps
    the detached loss in a dict, `on_train_batch_end(outputs, batch, batch_idx)` called on two callbacks (a
    tqdm bar that skips tqdm's update between draws, as Tandem's does, and a checkpoint callback with nothing
    to do mid-epoch), a global step, a stop flag, and every 50 steps one TensorBoard scalar event written with
    tensorboard's own record framing. No options, no hooks table, no checks: a floor, not a trainer.
    `min_interval_s` is the bar's least time between draws (the TQDMProgressBar default, tqdm's 0.1 s);
    `lookups=False` calls the model without the `self.model` lookups, as `wrapped(..., lookups=False)`."""
    import time

    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.record_writer import RecordWriter
    from tqdm import tqdm

    class Bar:
        def __init__(self, total: int) -> None:
            self.bar = tqdm(total=total, mininterval=min_interval_s)

        def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
            bar, done = self.bar, batch_idx + 1
            if time.time() - bar.last_print_t < bar.mininterval:
                bar.n = done
                return
            bar.set_postfix({k: f"{v.item():.3g}" for k, v in task.metrics.items()}, refresh=False)
            bar.update(done - bar.n)

    class Checkpoint:
        def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
            return None

    task, opt = wrapped(_FloorTask, model, lookups=lookups), make_optimizer(model)
    task.train()
    callbacks = (Bar(len(loader)), Checkpoint())
    global_step, should_stop = 0, False
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "events.out.tfevents.floor"), "wb") as f:
        events = RecordWriter(f)
        for batch_idx, batch in enumerate(loader):
            out: list[torch.Tensor] = []

            def closure(batch: Any = batch, batch_idx: int = batch_idx, out: list[Any] = out) -> torch.Tensor:
                loss = task.training_step(batch, batch_idx)
                opt.zero_grad(set_to_none=True)
                out.append(detached := loss.detach())
                loss.backward()
                return detached

            opt.step(closure)
            global_step += 1
            outputs = {"loss": out[0]}
            for callback in callbacks:
                callback.on_train_batch_end(outputs, batch, batch_idx)
            if global_step % 50 == 0:
                values = [Summary.Value(tag=k, simple_value=v.item()) for k, v in task.metrics.items()]
                event = Event(wall_time=time.time(), step=global_step, summary=Summary(value=values))
                events.write(event.SerializeToString())
                f.flush()
            if should_stop:
                break
        callbacks[0].bar.close()


def wrapped(base: type, model: torch.nn.Module, log: bool = True, lookups: bool = True) -> Any:
    """The same task code on either framework: a subclass of `base` (Task or LightningModule) around `model`.
    The --ablation variants leave out the self.log call, or also the two `self.model` lookups (in CPython
    3.11 an nn.Module attribute builds and drops an AttributeError before `__getattr__` finds it)."""

    class Wrapped(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            if lookups:
                loss = self.model.loss(self.model(x), y)
            else:
                loss = model.loss(model(x), y)  # type: ignore[operator]
            if log:
                self.log("train/loss", loss, prog_bar=True)
            return loss

        def configure_optimizers(self) -> Any:
            return make_optimizer(self)

    return Wrapped()


def _tandem(model: torch.nn.Module, loader: DataLoader, workdir: str, defaults: bool, **task: bool) -> None:
    """Tandem's Trainer, with its defaults or with logger, bar, checkpointing and summary off."""
    from trainer import Task, Trainer

    off = {} if defaults else dict(logger=False, enable_progress_bar=False, enable_checkpointing=False)
    trainer = Trainer(
        max_epochs=1, accelerator="cpu", default_root_dir=workdir, enable_model_summary=defaults, **off
    )
    trainer.fit(wrapped(Task, model, **task), train_dataloaders=loader)


def lightning_module() -> Any:
    """`lightning.pytorch` or else `pytorch_lightning`; ImportError when neither is installed."""
    try:
        import lightning.pytorch as pl
    except ImportError:
        import pytorch_lightning as pl
    return pl


def _lightning(model: torch.nn.Module, loader: DataLoader, workdir: str, defaults: bool) -> None:
    """PyTorch Lightning's Trainer, configured like `_tandem`."""
    pl = lightning_module()
    off = (
        {}
        if defaults
        else dict(
            logger=False, enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False
        )
    )
    trainer = pl.Trainer(max_epochs=1, accelerator="cpu", devices=1, default_root_dir=workdir, **off)
    trainer.fit(wrapped(pl.LightningModule, model), train_dataloaders=loader)


def lightning_available() -> bool:
    """Whether PyTorch Lightning can be imported."""
    try:
        lightning_module()
    except ImportError:
        return False
    return True


def contenders(
    with_lightning: bool, ablation: bool = False
) -> dict[str, Callable[[torch.nn.Module, DataLoader, str], None]]:
    """Name -> function(model, loader, workdir) that trains the model on the loader; with `ablation`, also
    the rows that split `tandem`'s cost: torch's closure path, the task's self.log, its self.model lookups,
    and the least any trainer keeping Lightning's per-step contract with logging and a bar on would add."""
    out: dict[str, Callable[[torch.nn.Module, DataLoader, str], None]] = {
        "raw": run_raw,
        "raw-again": run_raw,  # an A/A control: its ratio shows the harness's noise and bias (ideally 1.000)
        "tandem": lambda m, dl, d: _tandem(m, dl, d, defaults=False),
        "tandem-defaults": lambda m, dl, d: _tandem(m, dl, d, defaults=True),
    }
    if ablation:
        out["raw-closure"] = run_raw_closure
        out["floor"] = run_floor
        out["floor-bare-task"] = lambda m, dl, d: run_floor(m, dl, d, lookups=False)
        out["tandem-no-log"] = lambda m, dl, d: _tandem(m, dl, d, defaults=False, log=False)
        out["tandem-bare-task"] = lambda m, dl, d: _tandem(m, dl, d, defaults=False, log=False, lookups=False)
        out["tandem-defaults-bare-task"] = lambda m, dl, d: _tandem(m, dl, d, defaults=True, lookups=False)
    if with_lightning:
        out["lightning"] = lambda m, dl, d: _lightning(m, dl, d, defaults=False)
        out["lightning-defaults"] = lambda m, dl, d: _lightning(m, dl, d, defaults=True)
    return out
