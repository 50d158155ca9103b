"""strategies/base.py and strategies/__init__.py: the narrow contract, and strategies configured once."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from strategies import Strategy, resolve_strategy
from strategies.data_parallel import DataParallelStrategy
from strategies.ddp import DDPStrategy
from strategies.single import SingleDeviceStrategy
from tandem_core.errors import ConfigError
from tests.conftest import FAST
from trainer import Task, Trainer


def test_the_base_contract_has_at_most_17_public_members():  # 17th: compile (where compilation happens is the strategy's)
    # plus Lightning's connect/lightning_module: they only record the task (Lightning users' tests call them),
    # and Lightning's tensor_init_context: where a model is built (Trainer.init_module), before the loop runs
    settings = {"accelerator", "use_distributed_sampler"}  # constructor settings the Trainer may fill
    settings |= {"connect", "lightning_module", "tensor_init_context"}
    # Lightning's checkpoint-IO plugin: a setting (Trainer(plugins=[...]) assigns it)
    settings |= {"checkpoint_io"}
    settings |= {"precision_plugin"}  # (Lightning's name)
    settings |= {"launcher", "on_exception"}  # Lightning's: None (no process started here), and a no-op hook
    # Lightning's resume switch and hook for a strategy that restores its optimizers itself (a subclass's)
    settings |= {"lightning_restore_optimizer", "load_optimizer_state_dict"}
    public = sorted(n for n in dir(Strategy()) if not n.startswith("_") and n not in settings)
    assert len(public) <= 17, public
    assert {"comm", "backward", "step", "autocast", "optimizer_step", "launch", "setup", "compile"} <= set(
        public
    )


def test_ddp_strategy_keeps_its_own_precision():  # regression: it silently trained in 32-true
    trainer = Trainer(strategy=DDPStrategy(precision="bf16-mixed"), **FAST)
    assert trainer.precision == "bf16-mixed" and trainer.strategy.precision.name == "bf16-mixed"
    Trainer(strategy=DDPStrategy(precision="bf16-mixed"), precision="bf16", **FAST)  # the same: fine
    with pytest.raises(
        ConfigError,
        match=r"DDPStrategy\(precision='bf16-mixed'\) conflicts with Trainer\(precision='16-mixed'\)",
    ):
        Trainer(strategy=DDPStrategy(precision="bf16-mixed"), precision="16-mixed", **FAST)


def test_trainer_fills_only_what_the_strategy_left_unset():
    strategy = DDPStrategy(devices=2)
    Trainer(strategy=strategy, precision="bf16-mixed", **FAST)
    assert strategy.precision == "bf16-mixed" and strategy.devices == 2 and strategy.num_nodes == 1
    with pytest.raises(ConfigError, match=r"DDPStrategy\(devices=2\) conflicts with Trainer\(devices=3\)"):
        Trainer(strategy=DDPStrategy(devices=2), devices=3, **FAST)
    with pytest.raises(ConfigError, match="num_nodes=2"):
        Trainer(strategy=SingleDeviceStrategy(), num_nodes=2, **FAST)


def test_dp_device_list_versus_a_different_device_count_is_a_conflict():
    with pytest.raises(
        ConfigError, match=r"DataParallelStrategy\(devices=\[0, 1\]\) conflicts with Trainer\(devices=3\)"
    ):
        Trainer(strategy=DataParallelStrategy(accelerator="cpu", devices=[0, 1]), devices=3, **FAST)


class Reg(Task):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Linear(3, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_dp_strategy_with_trainer_devices_trains_like_one_device():  # regression: TypeError len(int)
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(16, 3, generator=g), torch.randn(16, 1, generator=g))
    dp, single = Reg(), Reg()
    Trainer(strategy=DataParallelStrategy(devices=2), devices=2, max_epochs=2, **FAST).fit(
        dp, DataLoader(data, batch_size=8)
    )
    Trainer(max_epochs=2, **FAST).fit(single, DataLoader(data, batch_size=8))
    for a, b in zip(dp.parameters(), single.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_resolve_by_name_and_lightning_aliases():
    opts = dict(
        accelerator="cpu", precision="32-true", devices="auto", num_nodes=1, use_distributed_sampler=True
    )
    assert isinstance(resolve_strategy("auto", opts), SingleDeviceStrategy)
    ddp = resolve_strategy("ddp_find_unused_parameters_true", {**opts, "devices": 2}, {"devices"})
    assert isinstance(ddp, DDPStrategy) and ddp.find_unused_parameters and ddp.devices == 2
    with pytest.raises(ConfigError, match="did you mean 'ddp'"):
        Trainer(strategy="ddq", **FAST)


def test_calling_a_per_task_step_method_keeps_no_task_alive():
    """Regression: FSDP replaces a task's step methods with closures over the task; the signature cache
    of call_step held them, and with them the task, its Trainer and the process group, until exit."""
    import gc
    import types
    import weakref

    from strategies.base import call_step

    class Stepper:
        def training_step(self, batch, batch_idx):
            return batch + batch_idx

    def wrap(task: Stepper) -> None:  # as torch's register_fsdp_forward_method does
        original = task.training_step
        task.training_step = types.MethodType(lambda self, *args: original(*args), task)

    task = Stepper()
    wrap(task)
    assert call_step(task.training_step, 1, 2) == 3
    alive = weakref.ref(task)
    del task
    gc.collect()
    assert alive() is None


def test_the_filled_defaults_are_the_trainers():
    """strategies.DEFAULTS repeats TrainerConfig's defaults of the options a strategy takes from the Trainer."""
    from dataclasses import fields

    from strategies import DEFAULTS, FILLED
    from trainer.options import TrainerConfig

    assert DEFAULTS == {f.name: f.default for f in fields(TrainerConfig) if f.name in FILLED}
