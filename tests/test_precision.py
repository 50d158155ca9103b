"""Precision: bf16/fp16 autocast with loss scaling, 64-bit, and what hooks and clipping see."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from strategies.precision import Precision
from tandem_core.errors import ConfigError
from trainer import Task, Trainer

FAST = dict(
    logger=False,
    enable_progress_bar=False,
    enable_checkpointing=False,
    enable_model_summary=False,
    num_sanity_val_steps=0,
)
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def loader(n: int = 32, batch_size: int = 8, device: str = "cpu") -> DataLoader:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(n, 4, generator=g)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [0.0]]) + 0.1
    return DataLoader(TensorDataset(x, y), batch_size=batch_size)


class Reg(Task):
    def __init__(self, loss_scale: float = 1.0, lr: float = 0.05) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
        self.loss_scale, self.lr = loss_scale, lr
        self.losses: list[float] = []
        self.dtypes: list[tuple[torch.dtype, torch.dtype, torch.dtype]] = []
        self.grads: list[list[torch.Tensor]] = []
        self.scales: list[float] = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        out = self.net(x)
        loss = F.mse_loss(out.float(), y.float()) * self.loss_scale
        self.dtypes.append((x.dtype, out.dtype, self.net[0].weight.dtype))
        self.losses.append(loss.item())
        return loss

    def on_before_optimizer_step(self, optimizer):
        self.grads.append([p.grad.detach().clone() for p in self.net.parameters()])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def _fit(tmp_path, precision, epochs: int = 1, task=Reg, accelerator: str = "cpu", **kw):
    """Train a fresh `task()` (a class or factory, built after seeding) for `epochs` epochs."""
    torch.manual_seed(0)
    task = task()
    trainer = Trainer(
        max_epochs=epochs,
        precision=precision,
        accelerator=accelerator,
        default_root_dir=str(tmp_path),
        **FAST,
        **kw,
    )
    trainer.fit(task, loader())
    return task, trainer


def _epoch_mean(losses: list[float], epoch: int, per_epoch: int = 4) -> float:
    return sum(losses[epoch * per_epoch : (epoch + 1) * per_epoch]) / per_epoch


@pytest.mark.parametrize(
    ("precision", "dtype"), [("bf16-mixed", torch.bfloat16), ("16-mixed", torch.float16)]
)
def test_mixed_precision_trains_on_cpu(tmp_path, precision, dtype):
    torch.manual_seed(0)
    start = [p.detach().clone() for p in Reg().parameters()]
    task, trainer = _fit(tmp_path, precision, epochs=15)
    # inputs stay fp32, autocast computes in `dtype`, the master weights stay fp32
    assert all(d == (torch.float32, dtype, torch.float32) for d in task.dtypes)
    assert all(not torch.equal(a, b) for a, b in zip(start, task.parameters()))
    assert _epoch_mean(task.losses, 14) < 0.5 * _epoch_mean(task.losses, 0)
    assert all(math.isfinite(v) for v in task.losses)


def test_mixed_precision_close_to_32_bit(tmp_path):
    # a small loss (and a matching learning rate) keeps fp16 from overflowing at the initial loss scale,
    # so no step is skipped and the runs stay comparable
    def small():
        return Reg(loss_scale=1e-3, lr=50.0)

    ref, _ = _fit(tmp_path, "32-true", epochs=3, task=small)
    for precision in ("bf16-mixed", "16-mixed"):
        task, _ = _fit(tmp_path, precision, epochs=3, task=small)
        assert task.losses == pytest.approx(ref.losses, rel=3e-2, abs=1e-6)
        assert task.losses != pytest.approx(ref.losses, rel=1e-6, abs=0)  # it really ran in lower precision


def test_16_mixed_has_a_grad_scaler_and_bf16_has_none(tmp_path):
    _, t16 = _fit(tmp_path, "16-mixed")
    _, tbf = _fit(tmp_path, "bf16-mixed")
    assert isinstance(t16.precision.scaler, torch.amp.GradScaler)
    assert tbf.precision.scaler is None


def test_16_mixed_skips_step_on_inf_gradient_and_lowers_scale(tmp_path):
    bad_step = 5

    class Poison(Reg):
        def on_before_backward(self, loss):
            self.scales.append(self.trainer.precision.scaler.get_scale())

        def on_after_backward(self):
            if self.global_step == bad_step:
                self.net[0].weight.grad[0, 0] = float("inf")

        def on_train_batch_start(self, batch, batch_idx):
            self.before = [p.detach().clone() for p in self.parameters()]

        def on_train_batch_end(self, outputs, batch, batch_idx):
            changed = [not torch.equal(a, b) for a, b in zip(self.before, self.parameters())]
            self.changed = [*getattr(self, "changed", []), changed]

    task, trainer = _fit(tmp_path, "16-mixed", epochs=3, task=lambda: Poison(loss_scale=1e-3))
    assert not any(task.changed[bad_step])  # the poisoned step left every weight as it was
    assert all(task.changed[bad_step - 1]) and all(task.changed[bad_step + 1])
    assert task.scales[bad_step + 1] == task.scales[bad_step] * 0.5
    assert all(s == task.scales[0] for s in task.scales[: bad_step + 1])  # no other overflow before it
    assert trainer.global_step == 12


def test_16_mixed_loss_times_inf_skips_step(tmp_path):
    class InfLoss(Reg):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            return loss * float("inf") if batch_idx == 1 else loss

        def on_train_batch_start(self, batch, batch_idx):
            self.before = [p.detach().clone() for p in self.parameters()]

        def on_train_batch_end(self, outputs, batch, batch_idx):
            changed = any(not torch.equal(a, b) for a, b in zip(self.before, self.parameters()))
            self.changed = [*getattr(self, "changed", []), changed]

    task, trainer = _fit(tmp_path, "16-mixed", task=lambda: InfLoss(loss_scale=1e-3))
    assert task.changed == [True, False, True, True]
    assert trainer.precision.scaler.get_scale() == 2.0**15
    assert all(torch.isfinite(p).all() for p in task.parameters())


def test_16_mixed_hooks_and_clipping_see_unscaled_gradients(tmp_path):
    ref, _ = _fit(tmp_path, "32-true", task=lambda: Reg(loss_scale=1e-2), gradient_clip_val=0.01)
    task, _ = _fit(tmp_path, "16-mixed", task=lambda: Reg(loss_scale=1e-2), gradient_clip_val=0.01)
    assert len(task.grads) == len(ref.grads) == 4
    for g16, g32 in zip(task.grads, ref.grads):
        for a, b in zip(g16, g32):
            torch.testing.assert_close(a, b, rtol=2e-2, atol=1e-4)
    # clipping was active (grad norm > 0.01) and applied to the true gradients: same weights
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in ref.grads[0]]))
    assert norm > 0.01
    for a, b in zip(task.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-3)


@pytest.mark.parametrize("algorithm", ["norm", "value"])
def test_gradient_clipping_matches_torch(tmp_path, algorithm):
    class Clipped(Reg):
        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.5)

    torch.manual_seed(0)
    ref = Reg()
    opt = torch.optim.SGD(ref.parameters(), lr=0.5)
    for x, y in loader():
        opt.zero_grad()
        F.mse_loss(ref.net(x), y).backward()
        if algorithm == "norm":
            torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.1)
        else:
            torch.nn.utils.clip_grad_value_(ref.parameters(), 0.01)
        opt.step()
    clip = 0.1 if algorithm == "norm" else 0.01
    task, _ = _fit(
        tmp_path, "32-true", task=Clipped, gradient_clip_val=clip, gradient_clip_algorithm=algorithm
    )
    for a, b in zip(task.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("precision", ["64", "64-true", 64])
def test_64_bit_trains_in_float64(tmp_path, precision):
    task, trainer = _fit(tmp_path, precision, epochs=2)
    assert all(d == (torch.float64, torch.float64, torch.float64) for d in task.dtypes)
    assert all(p.dtype == torch.float64 for p in task.parameters())
    assert trainer.precision.name == "64-true"
    assert _epoch_mean(task.losses, 1) < _epoch_mean(task.losses, 0)


def test_64_bit_keeps_integer_targets(tmp_path):
    seen = []

    class Cls(Task):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Linear(4, 3)

        def training_step(self, batch, batch_idx):
            x, y = batch
            seen.append((x.dtype, y.dtype))
            return F.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = TensorDataset(torch.randn(8, 4), torch.randint(0, 3, (8,)))
    Trainer(max_epochs=1, precision="64", accelerator="cpu", default_root_dir=str(tmp_path), **FAST).fit(
        Cls(), DataLoader(data, batch_size=4)
    )
    assert seen == [(torch.float64, torch.int64)] * 2


def test_precision_aliases():
    assert Precision(32).name == "32-true"
    assert Precision("bf16").name == "bf16-mixed"
    assert Precision(16).name == "16-mixed"
    assert Precision("64").param_dtype is torch.float64
    assert Precision("32-true").param_dtype is None


def test_unknown_precision_lists_valid_names():
    with pytest.raises(ConfigError, match=r"unknown precision 'fp8'.*'32-true'.*'bf16-mixed'.*'16-mixed'"):
        Trainer(precision="fp8", **FAST)
    with pytest.raises(ConfigError, match="did you mean '16-mixed'"):
        Trainer(precision="16-mixd", **FAST)


def test_grad_scaler_state_is_checkpointed(tmp_path):
    task, trainer = _fit(tmp_path, "16-mixed", task=lambda: Reg(loss_scale=1e-3))
    trainer.precision.scaler.update(new_scale=1234.0)
    path = str(tmp_path / "s.ckpt")
    trainer.save_checkpoint(path)
    t2 = Trainer(
        max_epochs=1, precision="16-mixed", accelerator="cpu", default_root_dir=str(tmp_path), **FAST
    )
    t2.fit(Reg(loss_scale=1e-3), loader(), ckpt_path=path)  # max_epochs reached: restores, trains nothing
    assert t2.precision.scaler.get_scale() == 1234.0


# ----- GPU (skipped without CUDA) -----------------------------------------------------------------


@cuda
@pytest.mark.parametrize(
    ("precision", "dtype"), [("bf16-mixed", torch.bfloat16), ("16-mixed", torch.float16)]
)
def test_mixed_precision_trains_on_cuda(tmp_path, precision, dtype):
    if precision == "bf16-mixed" and not torch.cuda.is_bf16_supported():
        pytest.skip("GPU has no bfloat16")
    task, trainer = _fit(tmp_path, precision, epochs=15, accelerator="cuda")
    assert trainer.strategy.root_device.type == "cuda"
    assert all(d[1] == dtype for d in task.dtypes)
    assert next(task.parameters()).device.type == "cuda"
    assert _epoch_mean(task.losses, 14) < 0.5 * _epoch_mean(task.losses, 0)


@cuda
def test_16_mixed_cuda_matches_32_bit(tmp_path):
    ref, _ = _fit(tmp_path, "32-true", epochs=2, accelerator="cuda")
    task, _ = _fit(tmp_path, "16-mixed", epochs=2, accelerator="cuda", task=Reg)
    assert task.losses == pytest.approx(ref.losses, rel=5e-2, abs=1e-2)


def test_manual_optimization_under_16_mixed(tmp_path):
    class Manual(Reg):
        def __init__(self) -> None:
            super().__init__(loss_scale=1e-3, lr=50.0)
            self.automatic_optimization = False

        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            opt = self.optimizers()
            opt.zero_grad()
            self.manual_backward(loss)
            self.grads.append([p.grad.detach().clone() for p in self.net.parameters()])  # still scaled here
            opt.step()

    ref, _ = _fit(tmp_path, "32-true", epochs=3, task=lambda: Reg(loss_scale=1e-3, lr=50.0))
    task, trainer = _fit(tmp_path, "16-mixed", epochs=3, task=Manual)
    scale = trainer.precision.scaler.get_scale()
    assert scale == 2.0**16  # no overflow, no skipped step
    assert task.losses == pytest.approx(ref.losses, rel=3e-2, abs=1e-6)
    torch.testing.assert_close(task.grads[0][0] / scale, ref.grads[0][0], rtol=2e-2, atol=1e-6)
