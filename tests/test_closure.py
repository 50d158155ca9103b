"""trainer/loop/closure.py: automatic optimization through Lightning's closure. Optimizers that evaluate the
closure several times (LBFGS, SAM-style) train as a hand-written torch loop; the hooks see what Lightning's
see (the divided loss under accumulation, a detached loss in on_train_batch_end)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from tandem_core.errors import ConfigError
from tests.conftest import FAST
from trainer import Task, Trainer


class SAM(torch.optim.Optimizer):
    """Sharpness-aware minimization: the closure is evaluated at w, then at w + rho * g / |g|."""

    def __init__(self, params, lr: float = 0.1, rho: float = 0.05) -> None:
        super().__init__(params, dict(lr=lr, rho=rho))

    @torch.no_grad()
    def step(self, closure):
        with torch.enable_grad():
            closure()
        params = [p for g in self.param_groups for p in g["params"] if p.grad is not None]
        norm = torch.norm(torch.stack([p.grad.norm() for p in params]))
        shifts = []
        for p in params:
            e = self.param_groups[0]["rho"] * p.grad / (norm + 1e-12)
            p.add_(e)
            shifts.append(e)
        with torch.enable_grad():
            loss = closure()
        for p, e in zip(params, shifts):
            p.sub_(e)
            p.add_(p.grad, alpha=-self.param_groups[0]["lr"])
        return loss


def data() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(32, 4, generator=g), torch.randn(32, 1, generator=g))


class Net(Task):
    def __init__(self, make_opt, override_step: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Linear(4, 1)
        self.make_opt, self.override_step, self.seen = make_opt, override_step, []

    def training_step(self, batch, batch_idx):
        return F.mse_loss(self.net(batch[0]), batch[1])

    def configure_optimizers(self):
        return self.make_opt(self.parameters())

    def on_before_backward(self, loss):
        self.seen.append(("before_backward", float(loss)))

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.seen.append(("batch_end", outputs))


def hand_loop(make_opt, batch_size: int = 8, epochs: int = 2) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    net = nn.Linear(4, 1)
    opt = make_opt(net.parameters())
    for _ in range(epochs):
        for x, y in DataLoader(data(), batch_size=batch_size):

            def closure(x=x, y=y):
                opt.zero_grad()
                loss = F.mse_loss(net(x), y)
                loss.backward()
                return loss

            opt.step(closure)
    return net.state_dict()


def fit(task: Task, **kwargs) -> Trainer:
    trainer = Trainer(**{**FAST, "max_epochs": 2, **kwargs})
    trainer.fit(task, DataLoader(data(), batch_size=8))
    return trainer


OPTIMIZERS = {
    "lbfgs": lambda params: torch.optim.LBFGS(params, lr=0.5, max_iter=4),
    "sam": lambda params: SAM(params),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("override_step", [False, True], ids=["default", "own_optimizer_step"])
def test_closure_reevaluating_optimizers_train_as_a_hand_loop(name, override_step):
    make = OPTIMIZERS[name]

    class Own(Net):
        def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure):
            optimizer.step(closure=optimizer_closure)

    task = (Own if override_step else Net)(make)
    trainer = fit(task)
    expected = hand_loop(make)
    for key, value in expected.items():
        torch.testing.assert_close(task.net.state_dict()[key], value, rtol=0, atol=1e-6)
    assert trainer.global_step == 8
    evaluations = sum(1 for kind, _ in task.seen if kind == "before_backward")
    assert evaluations > 8  # the closure ran several times per step, each time with the hooks


def test_hooks_see_the_divided_loss_and_a_detached_output_under_accumulation():
    task = Net(lambda params: torch.optim.SGD(params, lr=0.1))
    fit(task, max_epochs=1, accumulate_grad_batches=2)
    before = [v for kind, v in task.seen if kind == "before_backward"]
    ends = [v for kind, v in task.seen if kind == "batch_end"]
    assert len(before) == len(ends) == 4
    for value, out in zip(before, ends):
        assert set(out) == {"loss"} and not out["loss"].requires_grad
        assert float(out["loss"]) == pytest.approx(value)  # Lightning: loss / k in both
    x, y = data().tensors
    with torch.no_grad():
        torch.manual_seed(0)
        first = F.mse_loss(nn.Linear(4, 1)(x[:8]), y[:8])
    assert before[0] == pytest.approx(float(first) / 2)


def test_a_closure_optimizer_under_16_mixed_is_refused():
    with pytest.raises(ConfigError, match="LBFGS"):
        fit(Net(OPTIMIZERS["lbfgs"]), precision="16-mixed", max_epochs=1)


class Bare(Task):
    """No hook around the step: the closure's lean path, and the optimizer gets the closure itself."""

    def __init__(self, make_opt) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Linear(4, 1)
        self.make_opt = make_opt

    def training_step(self, batch, batch_idx):
        return F.mse_loss(self.net(batch[0]), batch[1])

    def configure_optimizers(self):
        return self.make_opt(self.parameters())


class Hooked(Bare):
    """The same task with hooks that do nothing: the closure's full path, through the step closure."""

    def on_before_backward(self, loss):
        pass

    def on_before_optimizer_step(self, optimizer):
        pass


@pytest.mark.parametrize("name", ["sgd", "lbfgs"])
def test_the_lean_closure_trains_as_the_full_one_and_a_hand_loop(name):
    from trainer.loop.closure import Closure
    from trainer.loop.optim import StepClosure

    given: list[type] = []
    base = torch.optim.LBFGS if name == "lbfgs" else torch.optim.SGD
    kwargs = dict(lr=0.5, max_iter=4) if name == "lbfgs" else dict(lr=0.1, momentum=0.9)

    class Recording(base):  # type: ignore[misc, valid-type]
        def step(self, closure=None):
            given.append(type(closure))
            return super().step(closure)

    make = lambda params: Recording(params, **kwargs)  # noqa: E731
    lean, full = Bare(make), Hooked(make)
    fit(lean)
    assert set(given) == {Closure}  # nothing to do around it: the optimizer calls the loop's closure
    given.clear()
    fit(full)
    assert set(given) == {StepClosure}
    for key, value in lean.net.state_dict().items():
        assert torch.equal(value, full.net.state_dict()[key])  # bit-identical: the same operations
        torch.testing.assert_close(value, hand_loop(make)[key], rtol=0, atol=1e-6)
