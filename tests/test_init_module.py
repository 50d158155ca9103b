"""Trainer.init_module and the strategies' tensor_init_context against Lightning's (device, dtype, meta, empty
init), configure_model under the init context, materialization of meta-built tasks at setup (reset_parameters,
the clear error without it), and weights that wait on a meta-built task (load_pretrained, load_from_checkpoint
inside init_module, fit(ckpt_path=...)), in one process. The multi-rank parts: tests/test_large_models.py."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from callbacks import Callback
from strategies.ddp import DDPStrategy
from strategies.fsdp import FSDPStrategy
from strategies.model_parallel import ModelParallelStrategy
from tandem_core.errors import TaskError
from tests.conftest import FAST
from trainer import Task, Trainer

PRECISIONS = ("32-true", "64-true", "bf16-true", "16-true", "bf16-mixed")


def _made(trainer, empty_init):
    with trainer.init_module(empty_init=empty_init):
        w = nn.Linear(2, 2).weight
    return w.device.type, w.dtype


@pytest.mark.parametrize("name", ["auto", "ddp", "model_parallel"])
def test_init_module_places_tensors_as_lightning_does(name):
    pl = pytest.importorskip("pytorch_lightning")
    from pytorch_lightning.strategies import DDPStrategy as PLDDP
    from pytorch_lightning.strategies import ModelParallelStrategy as PLMP

    ours = {"auto": lambda: "auto", "ddp": lambda: DDPStrategy(), "model_parallel": ModelParallelStrategy}
    theirs = {"auto": lambda: "auto", "ddp": PLDDP, "model_parallel": PLMP}
    checked = 0
    for precision in PRECISIONS:
        if name == "model_parallel" and precision == "64-true":
            continue  # Lightning's refuses it (Tandem's takes it: the parity tests of model_parallel run in float64)
        for empty in (None, False, True):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                pt = pl.Trainer(accelerator="cpu", devices=1, strategy=theirs[name](), precision=precision,
                                logger=False, enable_checkpointing=False, enable_progress_bar=False)  # fmt: skip
                tt = Trainer(strategy=ours[name](), devices=1, precision=precision, **FAST)
            assert _made(tt, empty) == _made(pt, empty), (name, precision, empty)
            checked += 1
    assert checked >= 12


@pytest.mark.parametrize("precision", PRECISIONS)
def test_fsdp_and_pipeline_build_on_meta_only_with_empty_init(precision):
    # (Lightning's FSDPStrategy refuses a CPU; its rule is its ModelParallelStrategy's, checked above)
    from strategies.pipeline import PipelineStrategy

    dtype = {"64-true": torch.float64, "bf16-true": torch.bfloat16, "16-true": torch.float16}.get(
        precision, torch.float32
    )
    for strategy in (FSDPStrategy(), PipelineStrategy()):
        t = Trainer(strategy=strategy, devices=1, precision=precision, **FAST)
        assert _made(t, True) == ("meta", dtype)
        assert _made(t, None) == _made(t, False) == ("cpu", dtype)


def test_empty_init_skips_the_initializers_on_a_device():
    # the initializers draw random numbers: under empty_init=True none are drawn (Lightning's _EmptyInit)
    t = Trainer(strategy="auto", **FAST)
    before = torch.get_rng_state()
    with t.init_module(empty_init=True):
        layer = nn.Linear(3, 3)
    assert torch.equal(torch.get_rng_state(), before) and layer.weight.device.type == "cpu"
    with t.init_module(empty_init=False):
        nn.Linear(3, 3)
    assert not torch.equal(torch.get_rng_state(), before)


class Net(Task):
    """An MLP with a LayerNorm and an embedding-free head; configure_model adds a layer (built under the init
    context); `extra` adds a module without reset_parameters."""

    def __init__(self, extra: bool = False, lr: float = 0.1):
        super().__init__()
        self.fc1, self.norm, self.fc2 = nn.Linear(6, 16), nn.LayerNorm(16), nn.Linear(16, 3)
        self.extra = Scale() if extra else None
        self.late: nn.Linear | None = None
        self.seen: dict[str, torch.Tensor] = {}

    def configure_model(self):
        if self.late is None:
            self.late = nn.Linear(3, 3)

    def forward(self, x):
        h = self.norm(torch.relu(self.fc1(x)))
        h = self.extra(h) if self.extra is not None else h
        return self.late(self.fc2(h))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Scale(nn.Module):
    def __init__(self):
        super().__init__()
        self.gain = nn.Parameter(torch.ones(16))

    def forward(self, x):
        return x * self.gain


class Snapshot(Callback):
    """The task's weights when fit starts (after setup and any restore, before a step)."""

    def on_fit_start(self, trainer, task):
        task.seen = {k: v.detach().clone() for k, v in task.state_dict().items()}


def _data(dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    return DataLoader(
        TensorDataset(torch.randn(16, 6, generator=g).to(dtype), torch.randint(0, 3, (16,), generator=g)),
        batch_size=4,
    )


def test_configure_model_runs_under_the_init_context_as_in_lightning():
    t = Trainer(strategy="auto", precision="64-true", max_steps=1, **FAST)
    task = Net()
    t.fit(task, _data(torch.float64))
    assert task.late.weight.dtype == torch.float64
    pl = pytest.importorskip("pytorch_lightning")

    class Theirs(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.late = None

        def configure_model(self):
            self.late = nn.Linear(6, 3)
            self.made = self.late.weight.dtype

        def training_step(self, batch, batch_idx):
            return F.cross_entropy(self.late(batch[0]), batch[1])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    theirs = Theirs()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pl.Trainer(accelerator="cpu", precision="64-true", max_steps=1, logger=False, enable_checkpointing=False,
                   enable_progress_bar=False, enable_model_summary=False).fit(theirs, _data(torch.float64))  # fmt: skip
    assert theirs.made == torch.float64


@pytest.mark.parametrize("strategy", ["single", "fsdp"])
def test_a_task_built_on_meta_is_materialized_with_reset_parameters(strategy):
    t = Trainer(strategy=strategy, devices=1, max_steps=2, callbacks=[Snapshot()], **FAST)
    torch.manual_seed(0)
    with torch.device("meta"):
        task = Net()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fsdp in one process says it trains unsharded
        t.fit(task, _data())
    seen = task.seen
    bound = 1 / 6**0.5
    assert seen["fc1.weight"].abs().max() <= bound and seen["fc1.weight"].std() > bound / 3
    assert torch.equal(seen["norm.weight"], torch.ones(16)) and torch.equal(
        seen["norm.bias"], torch.zeros(16)
    )
    assert all(v.device.type == "cpu" and torch.isfinite(v).all() for v in seen.values())
    assert task.global_step == 2


def test_a_meta_module_without_reset_parameters_is_a_clear_error():
    t = Trainer(strategy="auto", max_steps=1, **FAST)
    with torch.device("meta"):
        task = Net(extra=True)
    with pytest.raises(TaskError, match=r"extra \(Scale\).*reset_parameters.*load_pretrained"):
        t.fit(task, _data())


@pytest.mark.parametrize("strategy", ["auto", "fsdp"])
def test_load_pretrained_into_a_meta_task_waits_for_setup(tmp_path, strategy):
    torch.manual_seed(1)
    source = Net(extra=True)
    source.configure_model()
    path = tmp_path / "weights.pt"
    torch.save(source.state_dict(), path)
    t = Trainer(strategy=strategy, devices=1, max_steps=1, callbacks=[Snapshot()], **FAST)
    with t.init_module(empty_init=True):
        task = Net(extra=True)  # Scale has no reset_parameters: the file fills it
        task.configure_model()
    task.load_pretrained(str(path))
    on_meta = strategy == "fsdp"
    assert task.fc1.weight.is_meta == on_meta
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t.fit(task, _data())
    for k, v in source.state_dict().items():
        assert torch.equal(task.seen[k], v), k


def test_load_pretrained_loads_at_once_and_checks_the_file(tmp_path):
    source = Net()
    source.configure_model()
    path = tmp_path / "w.pt"
    torch.save({"state_dict": source.state_dict(), "epoch": 3}, path)  # a checkpoint's "state_dict"
    task = Net()
    task.configure_model()
    task.load_pretrained(str(path))
    assert torch.equal(task.fc1.weight, source.fc1.weight)
    torch.save({"fc1.weight": torch.zeros(2)}, path)
    from tandem_core.errors import CheckpointError

    with pytest.raises(CheckpointError, match="missing keys.*shape mismatches"):
        task.load_pretrained(str(path))
    torch.save({"weights": [1, 2]}, path)
    with pytest.raises(CheckpointError, match="holds no state dict"):
        task.load_pretrained(str(path))


class Saved(Net):
    def __init__(self, width: int = 16):
        super().__init__(extra=True)
        self.save_hyperparameters()


def test_load_from_checkpoint_inside_init_module_and_fit_ckpt_path_fill_a_meta_task(tmp_path):
    torch.manual_seed(2)
    t = Trainer(strategy="auto", max_steps=1, **FAST)
    source = Saved()
    t.fit(source, _data())
    path = str(tmp_path / "a.ckpt")
    t.save_checkpoint(path)
    t2 = Trainer(strategy=FSDPStrategy(), devices=1, max_steps=1, callbacks=[Snapshot()], **FAST)
    with t2.init_module(empty_init=True):
        task = Saved.load_from_checkpoint(path)
    assert task.fc1.weight.is_meta
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t2.fit(task, _data())
    for k, v in source.state_dict().items():
        assert torch.equal(task.seen[k], v), k
    # a meta task with a module lacking reset_parameters, filled by fit(ckpt_path=...)
    t3 = Trainer(strategy=FSDPStrategy(), devices=1, max_steps=2, callbacks=[Snapshot()], **FAST)
    with t3.init_module(empty_init=True):
        task = Saved()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t3.fit(task, _data(), ckpt_path=path)
    for k, v in source.state_dict().items():
        assert torch.equal(task.seen[k], v), k
    assert task.global_step == 2
