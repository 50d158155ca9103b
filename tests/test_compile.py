"""torch.compile through the Trainer (trainer/compiler.py): Trainer(compile=...) and fit(torch.compile(task))
train like eager runs, checkpoints keep plain names, resume is bit-identical, recompilations say why; under
ddp the compiled graph is split at the Reducer's bucket size so that all-reduces still overlap backward."""

from __future__ import annotations

import os
import warnings

import pytest
import torch
import torch.nn.functional as F
from conftest import QUIET
from torch.utils.data import DataLoader, TensorDataset

from callbacks import Callback
from tandem_core.errors import ConfigError
from trainer import Task, Trainer

WIDTH, DEPTH = 256, 6


class Deep(Task):
    """A stack of Linear+Tanh whose training_step goes through forward (what compile compiles)."""

    def __init__(self, lr: float = 0.05, width: int = WIDTH) -> None:
        super().__init__()
        torch.manual_seed(0)
        layers = [m for _ in range(DEPTH) for m in (torch.nn.Linear(width, width), torch.nn.Tanh())]
        self.net = torch.nn.Sequential(*layers, torch.nn.Linear(width, 4))
        self.lr = lr

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train/loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def data(n: int = 128, width: int = WIDTH) -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    return TensorDataset(torch.randn(n, width, generator=g), torch.randint(0, 4, (n,), generator=g))


def fit(task: Task | torch.nn.Module, **kwargs) -> Trainer:
    trainer = Trainer(accelerator="cpu", **{**QUIET, "max_epochs": 2, **kwargs})
    trainer.fit(task, DataLoader(data(), batch_size=16))
    return trainer


def assert_same_weights(a: dict, b: dict, atol: float = 1e-6) -> None:
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=atol, rtol=0, msg=k)


def test_fit_of_a_torch_compiled_task_trains_like_eager_and_gives_the_task_back():
    eager = Deep()
    fit(eager)
    task = Deep()
    compiled = torch.compile(task)
    trainer = fit(compiled)
    assert trainer.lightning_module is task  # unwrapped, as Lightning does
    assert trainer.global_step == 16
    assert_same_weights(task.state_dict(), eager.state_dict())
    assert not any(k.startswith("_orig_mod") for k in task.state_dict())
    assert task._compiled_call_impl is None and "training_step" not in task.__dict__  # uncompiled again


def test_compiled_and_eager_runs_resume_each_others_checkpoints(tmp_path):
    kw = dict(max_epochs=-1, compile={"backend": "eager"})  # dynamo's own pieces, no codegen: fast
    first = Deep()
    fit(first, max_steps=5, **kw)
    path = str(tmp_path / "compiled.ckpt")
    first.trainer.save_checkpoint(path)
    saved = torch.load(path, weights_only=True)["state_dict"]
    assert list(saved) == list(Deep().state_dict())  # plain names: no "_orig_mod."
    resumed = Deep()  # eager, from the compiled run's checkpoint
    trainer = Trainer(accelerator="cpu", max_steps=9, **QUIET)
    trainer.fit(resumed, DataLoader(data(), batch_size=16), ckpt_path=path)
    assert trainer.global_step == 9
    whole = Deep()
    fit(whole, max_steps=9, max_epochs=-1)
    assert_same_weights(resumed.state_dict(), whole.state_dict(), atol=0)


def test_resume_under_compile_is_bit_identical(tmp_path):
    compile_kw = {"compile": True, "max_epochs": -1}
    whole = Deep()
    fit(whole, max_steps=10, **compile_kw)
    part = Deep()
    fit(part, max_steps=4, **compile_kw)
    path = str(tmp_path / "at4.ckpt")
    part.trainer.save_checkpoint(path)
    resumed, steps = Deep(), StepsSeen()
    trainer = Trainer(accelerator="cpu", max_steps=10, compile=True, **{**QUIET, "callbacks": [steps]})
    trainer.fit(resumed, DataLoader(data(), batch_size=16), ckpt_path=path)
    assert steps.seen[0] == 4 and trainer.global_step == 10
    assert_same_weights(resumed.state_dict(), whole.state_dict(), atol=0)


class StepsSeen(Callback):
    """Records global_step at the start of every training batch."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    def on_train_batch_start(self, trainer, task, batch, batch_idx) -> None:
        self.seen.append(trainer.global_step)


def test_compile_is_refused_where_it_cannot_be_honoured():
    with pytest.raises(ConfigError, match="compile in one place only"):
        fit(torch.compile(Deep()), compile=True)
    with pytest.raises(ConfigError, match="torch.compile does not take"):
        Trainer(compile={"mode": "default", "fast": True})
    with pytest.raises(ConfigError, match="compile must be"):
        Trainer(compile="yes")
    with pytest.raises(ConfigError, match="strategy='dp' cannot run a compiled task"):
        fit(Deep(), strategy="dp", devices=2, compile=True)


class Manual(Deep):
    """Manual optimization: the compiled training_step calls the Trainer's side (optimizers, backward, log)."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        opt.zero_grad()
        self.manual_backward(loss)
        opt.step()
        self.log("train/loss", loss)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val/loss", F.cross_entropy(self(x), y))

    def predict_step(self, batch, batch_idx):
        return self(batch[0]).argmax(-1)


def test_manual_optimization_validate_and_predict_under_compile():
    eager, compiled = Manual(), Manual()
    loader = DataLoader(data(), batch_size=16)
    runs = {}
    for name, task, opt in (("eager", eager, False), ("compiled", compiled, {"backend": "eager"})):
        trainer = Trainer(accelerator="cpu", max_epochs=1, compile=opt, **QUIET)
        trainer.fit(task, loader, loader)
        runs[name] = (trainer.validate(task, loader, verbose=False), torch.cat(trainer.predict(task, loader)))
    assert_same_weights(compiled.state_dict(), eager.state_dict(), atol=0)
    assert runs["compiled"][0] == runs["eager"][0]
    assert torch.equal(runs["compiled"][1], runs["eager"][1])


class Ragged(Deep):
    """A Python int (batch_idx) decides a shape: under dynamic=False each new value is a recompilation."""

    def training_step(self, batch, batch_idx):
        x, y = batch
        n = 4 + batch_idx % 8
        return F.cross_entropy(self(x[:n]), y[:n])


def test_recompilations_say_why():
    torch._dynamo.reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit(Ragged(), max_epochs=1, compile={"backend": "eager", "dynamic": False})
    said = [str(w.message) for w in caught if "recompiled" in str(w.message)]
    assert said, "8 values of batch_idx under dynamic=False recompile; the run must say so"
    assert "recompiled 7 times" in said[0] and "batch_idx == 0" in said[0]  # torch's reason, shown
    assert "dynamic=True" in said[0]


def test_no_recompilation_warning_for_a_steady_run():
    torch._dynamo.reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit(Deep(), compile={"backend": "eager"})
    assert not [w for w in caught if "recompiled" in str(w.message)]


# ----- several processes --------------------------------------------------------------------------------
def _ddp_fit(rank: int, world_size: int, compile_opt, split: bool) -> dict:
    from strategies.ddp import DDPStrategy

    if not split:  # the negative control: dynamo without the DDP splitter, one graph per step
        torch._dynamo.config.optimize_ddp = False
    task = Deep(width=512)  # 1 MB per weight: one bucket (and one compiled piece) per layer
    strategy = DDPStrategy(accelerator="cpu", devices=2, bucket_cap_mb=1.0)
    trainer = Trainer(accelerator="cpu", strategy=strategy, max_steps=6, compile=compile_opt, **QUIET)
    trainer.fit(task, DataLoader(data(1536, 512), batch_size=128))  # compute well above hook costs
    reducer = strategy.reducer
    assert reducer is not None
    return {
        "state": task.state_dict(),
        "ready_s": [s.ready_s for s in reducer.stats],
        "last_grad_s": reducer.last_grad_s,
        "step": trainer.global_step,
    }


@pytest.mark.slow
def test_ddp_compiled_equals_eager_and_keeps_its_overlap(dist_run):
    eager = dist_run(_ddp_fit, False, True)
    split = dist_run(_ddp_fit, True, True, timeout=400)
    whole = dist_run(_ddp_fit, True, False, timeout=400)
    for r in (*split, *whole):
        assert r["step"] == 6
        assert_same_weights(r["state"], eager[0]["state"], atol=1e-5)

    def spread(r: dict) -> float:  # when the first bucket was ready, as a fraction of the gradients' span
        return 1.0 - min(r["ready_s"]) / r["last_grad_s"]

    # split at the bucket size: the last layers' bucket is ready early in backward (its piece ended first);
    # one graph per step: every gradient arrives at the end, so the first bucket is ready late
    # (measured on 2 shared cores: split 0.85-0.88, one graph 0.07-0.17)
    for r_split, r_whole in zip(split, whole):
        assert len(r_split["ready_s"]) >= 6, r_split["ready_s"]  # about one bucket per 1 MB layer
        assert spread(r_split) > 0.6, r_split["ready_s"]
        assert spread(r_whole) < 0.4, r_whole["ready_s"]  # the measure tells the two apart


def _fsdp_fit(rank: int, world_size: int, compile_opt) -> dict:
    from strategies.fsdp import FSDPStrategy

    task = Deep()
    strategy = FSDPStrategy(accelerator="cpu", devices=2, min_params=50_000, save_full=True)
    trainer = Trainer(accelerator="cpu", strategy=strategy, max_steps=6, compile=compile_opt, **QUIET)
    trainer.fit(task, DataLoader(data(256), batch_size=16))
    path = os.path.join(os.environ["TANDEM_TEST_DIR"], f"fsdp-{bool(compile_opt)}.ckpt")
    trainer.save_checkpoint(path)
    return {"units": strategy.units, "step": trainer.global_step, "path": path}


@pytest.mark.slow
def test_fsdp_compiled_equals_eager(dist_run, tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_TEST_DIR", str(tmp_path))
    eager = dist_run(_fsdp_fit, False)
    compiled = dist_run(_fsdp_fit, True, timeout=400)
    assert len(compiled[0]["units"]) > 2 and compiled[0]["step"] == 6
    a = torch.load(eager[0]["path"], weights_only=True)["state_dict"]
    b = torch.load(compiled[0]["path"], weights_only=True)["state_dict"]
    assert_same_weights(b, a, atol=1e-5)


def _ddp_resume(rank: int, world_size: int, tmp: str) -> dict:
    from strategies.ddp import DDPStrategy

    def run(steps: int, ckpt: str | None = None) -> tuple[Task, Trainer, StepsSeen]:
        task, seen = Deep(), StepsSeen()
        strategy = DDPStrategy(accelerator="cpu", devices=2, bucket_cap_mb=1.0)
        trainer = Trainer(
            accelerator="cpu",
            strategy=strategy,
            max_steps=steps,
            compile=True,
            **{**QUIET, "callbacks": [seen]},
        )
        trainer.fit(task, DataLoader(data(256), batch_size=16), ckpt_path=ckpt)
        return task, trainer, seen

    whole, _, _ = run(10)
    _, part, _ = run(4)
    path = os.path.join(tmp, "ddp4.ckpt")
    part.save_checkpoint(path)
    resumed, trainer, seen = run(10, path)
    return {
        "first_step": seen.seen[0],
        "step": trainer.global_step,
        "same": all(
            torch.equal(a, b) for a, b in zip(resumed.state_dict().values(), whole.state_dict().values())
        ),
    }


@pytest.mark.slow
def test_ddp_resume_under_compile_is_bit_identical(dist_run, tmp_path):
    for r in dist_run(_ddp_resume, str(tmp_path), timeout=400):
        assert r["first_step"] == 4 and r["step"] == 10
        assert r["same"]


def test_importing_the_trainer_does_not_import_the_compiler_stack():
    """`from trainer import Task, Trainer` stays about 0.1 s: torch._dynamo (about 1 s) loads only when a
    run compiles (a decorator such as torch.compiler.disable at import time would load it)."""
    import subprocess
    import sys

    code = "import sys, torch\nfrom trainer import Task, Trainer\nassert 'torch._dynamo' not in sys.modules\n"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=os.path.dirname(os.path.dirname(__file__)))
