"""compile with CUDA graphs (mode "reduce-overhead", issue 41): a graph replay writes its outputs into the memory of
the previous replay, so the loop must keep nothing of a step's outputs past the step (the closure's detached loss,
the step values in callback_metrics and logged_metrics, an epoch aggregate's first value) and must tell torch
when a step begins (torch.compiler.cudagraph_mark_step_begin). On the CPU no graph is replayed: the compiler is
told it replays them (Compiler.cudagraphs), with dynamo's eager backend, and the test checks where the kept
values live and how often the mark is called."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from tests.conftest import FAST
from trainer import Task, Trainer
from trainer.compiler import Compiler


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


_OUTS: list[
    torch.Tensor
] = []  # the steps' outputs (each loss and the value it logged), kept alive to the end,
# so that no storage compared is freed and reused


@torch.compiler.disable  # (run eagerly, and dynamo does not guard on the list)
def _hold(*tensors: torch.Tensor) -> None:
    _OUTS.extend(tensors)


@pytest.mark.parametrize(
    ("kwargs", "replays"),
    [({"mode": "reduce-overhead"}, True), ({"mode": "max-autotune"}, True), ({"backend": "cudagraphs"}, True),
     ({}, False), ({"mode": "default"}, False), ({"mode": "max-autotune-no-cudagraphs"}, False),
     ({"backend": "eager"}, False)],
)  # fmt: skip
def test_the_compiler_knows_which_options_replay_cuda_graphs(kwargs, replays):
    assert Compiler(kwargs=kwargs).cudagraphs is replays
    if (
        "mode" in kwargs
    ):  # the same read from a module the user compiled (torch.compile is lazy: no compile here)
        compiled = torch.compile(torch.nn.Linear(2, 2), **kwargs)
        assert Compiler(context=compiled.dynamo_ctx).cudagraphs is replays


class _Kept(Task):
    """Records, per step, the storage of what training_step returned and logged, and of what the loop kept."""

    def __init__(self, automatic: bool = True) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(3, 1)
        self.automatic_optimization = automatic
        self.outs = _OUTS
        self.outs.clear()
        self.kept: list[torch.Tensor] = []  # what the loop holds after each step (kept alive too)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        (x,) = batch
        loss = F.mse_loss(self.lin(x), torch.zeros(len(x), 1))
        logged = loss * 2
        self.log("loss", logged, on_step=True, on_epoch=True, reduce_fx="sum")
        _hold(loss, logged)
        if not self.automatic_optimization:
            opt = self.optimizers()
            opt.zero_grad()
            self.manual_backward(loss)
            opt.step()
        return loss

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        metrics = self.trainer.callback_metrics
        kept = [metrics["loss"], metrics["loss_step"], *self.trainer.logged_metrics.values()]
        self.kept += [*kept, outputs["loss"]]

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val", self.lin(batch[0]).mean())

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


@pytest.mark.parametrize("automatic", [True, False], ids=["automatic", "manual"])
def test_under_cuda_graphs_each_step_is_marked_and_nothing_kept_is_a_step_output(monkeypatch, automatic):
    monkeypatch.setattr(Compiler, "cudagraphs", property(lambda self: True))
    marks: list[int] = []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))
    data = TensorDataset(torch.randn(24, 3))
    task = _Kept(automatic)
    trainer = Trainer(max_epochs=2, compile={"backend": "eager"}, **FAST)
    trainer.fit(task, DataLoader(data, batch_size=4), DataLoader(data, batch_size=12))
    assert len(marks) == 2 * (6 + 2)  # once per training step and per validation batch, 2 epochs
    outs = {_storage(t) for t in task.outs}
    assert task.kept and not {_storage(t) for t in task.kept} & outs
    aggregate = trainer.callback_metrics["loss_epoch"]  # the epoch's sum, from a copy of its first value
    assert _storage(aggregate) not in outs


def test_without_cuda_graphs_nothing_is_marked_or_copied(monkeypatch):
    marks: list[int] = []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))
    task = _Kept()
    Trainer(max_epochs=1, **FAST).fit(task, DataLoader(TensorDataset(torch.randn(8, 3)), batch_size=4))
    assert not marks
    # the loop keeps the step's values themselves: no copy per step
    assert {_storage(t) for t in task.kept} & {_storage(t) for t in task.outs}
