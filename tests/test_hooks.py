"""trainer/loop/hooks.py: hooks declared once, stubs generated for Task and Callback, the dispatcher."""

from __future__ import annotations

import inspect

import torch
from torch.utils.data import DataLoader, TensorDataset

from callbacks import Callback
from tandem_core.hooks import CALLBACK, HOOKS, TASK, overrides
from tests.conftest import FAST
from trainer import Task, Trainer
from trainer.loop.hooks import Hooks


class Tiny(Task):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        return self.net(batch[0]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def loader() -> DataLoader:
    return DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=4)


def test_every_declared_hook_is_a_documented_stub_on_its_owners():
    for hook in HOOKS:
        for cls, owner, lead in ((Task, TASK, ["self"]), (Callback, CALLBACK, ["self", "trainer", "task"])):
            fn = getattr(cls, hook.name, None)
            if owner not in hook.owners:
                assert fn is None or not getattr(fn, "_tandem_default", False), (cls, hook.name)
                continue
            assert fn is not None and fn.__doc__ == hook.doc, (cls, hook.name)
            names = list(inspect.signature(fn).parameters)
            assert names == lead + [a.partition("=")[0] for a in hook.args], (cls, hook.name, names)
    assert Task.on_train_batch_start(Tiny(), None, 0) is None  # a stub does nothing


def test_dispatcher_collects_only_overrides_in_lightning_order():
    order = []

    class Plain(Callback):
        def on_train_epoch_start(self, trainer, task):
            order.append("plain")

    class Monitor(Callback):
        monitoring = True

        def on_train_epoch_start(self, trainer, task):
            order.append("monitor")

    class WithHook(Tiny):
        def on_train_epoch_start(self):
            order.append("task")

    task = WithHook()
    hooks = Hooks(task, [Monitor(), Plain()], trainer=None)
    assert "on_train_epoch_start" in hooks and "on_fit_start" not in hooks
    assert overrides(task, "on_train_epoch_start") and not overrides(task, "on_fit_start")
    hooks.call("on_train_epoch_start")  # Lightning: every callback in the Trainer's order, then the module
    assert order == ["monitor", "plain", "task"]
    order.clear()
    hooks.call("on_train_epoch_start", monitoring=False)  # on_train_epoch_end's split: plain and the task...
    assert order == ["plain", "task"]
    order.clear()
    hooks.call("on_train_epoch_start", monitoring=True)  # ...then the monitoring callbacks
    assert order == ["monitor"]
    assert hooks.call("on_fit_start") is None  # nobody overrides it: nothing runs


def test_a_fit_calls_hooks_through_the_dispatcher_with_their_arguments():
    seen = []

    class Recorder(Callback):
        def on_train_batch_end(self, trainer, task, outputs, batch, batch_idx):
            seen.append(("cb", batch_idx, trainer.global_step))

    class Task2(Tiny):
        def on_train_batch_start(self, batch, batch_idx):
            seen.append(("task", batch_idx, self.global_step))

    Trainer(max_epochs=1, callbacks=[Recorder()], **FAST).fit(Task2(), loader())
    assert seen == [("task", 0, 0), ("cb", 0, 1), ("task", 1, 1), ("cb", 1, 2)]


def test_super_calls_into_stubs_work():
    class Cb(Callback):
        def on_fit_start(self, trainer, task):
            super().on_fit_start(trainer, task)
            self.ran = True

    cb = Cb()
    Trainer(max_steps=1, callbacks=[cb], **FAST).fit(Tiny(), loader())
    assert cb.ran


def test_caller_does_what_call_does_and_is_none_for_hooks_nobody_overrides():
    order = []

    class A(Callback):
        def on_train_batch_start(self, trainer, task, batch, batch_idx):
            order.append(("a", batch_idx))
            return 7

    class B(Callback):
        def on_train_batch_start(self, trainer, task, batch, batch_idx):
            order.append(("b", batch_idx))

    class WithHook(Tiny):
        def on_train_batch_start(self, batch, batch_idx):
            order.append(("task", batch_idx))
            return -1

    task = WithHook()
    assert Hooks(task, [A()], trainer=None).caller("on_fit_start") is None  # the loop skips it outright
    only = Hooks(Tiny(), [A()], trainer=None).caller("on_train_batch_start")
    assert only(None, 3) == 7 and order == [("a", 3)]  # one override: called as it is
    order.clear()
    hooks = Hooks(task, [A(), B()], trainer=None)
    fn = hooks.caller("on_train_batch_start", result=True)
    assert fn(None, 1) == -1 == hooks.call("on_train_batch_start", None, 2)  # the last non-None result
    assert order == [("a", 1), ("b", 1), ("task", 1), ("a", 2), ("b", 2), ("task", 2)]
    order.clear()
    each = hooks.caller("on_train_batch_start")  # a hook whose result nobody reads: every override, in order
    assert each(None, 4) is None and order == [("a", 4), ("b", 4), ("task", 4)]
    assert hooks.caller("on_train_batch_start", monitoring=True) is None  # no monitoring callback has it
