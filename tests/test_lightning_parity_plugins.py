"""``Trainer(plugins=[...])`` and the connector's choices, side by side with Lightning on the same arguments: the
precision plugin each precision name builds, the plugins' own methods, the refusals (a plugin of no kind, two of
one kind, a precision both as a flag and as a plugin, sync_batchnorm with a custom LayerSync), the cluster
environment the variables of a process name with the ranks read from it, StrategyRegistry's entries, and a run
with a precision plugin equal to the run with its name."""

from __future__ import annotations

import os
from typing import Any
from unittest import mock

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import trainer.plugins as ours
from strategies import DDPStrategy, StrategyRegistry
from tandem_core.errors import TandemError
from trainer import Task, Trainer

pl = pytest.importorskip("pytorch_lightning")
import pytorch_lightning.plugins as theirs  # noqa: E402
from lightning_fabric.plugins import environments as their_envs  # noqa: E402

QUIET = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)


def lightnings(name: str) -> Any:
    """Lightning's plugin class `name` (its environments are in lightning.pytorch.plugins.environments)."""
    return getattr(theirs, name, None) or getattr(their_envs, name)


def both(**kwargs: Any) -> tuple[Any, Any]:
    """(Lightning's Trainer, Tandem's Trainer) built with the same arguments (plugins named per side)."""
    ptheirs = [lightnings(type(p).__name__)() for p in kwargs.get("plugins", [])]
    lt = pl.Trainer(**{**kwargs, "plugins": ptheirs or None}, **QUIET)
    return lt, Trainer(**kwargs, **QUIET)


@pytest.mark.parametrize(
    "precision", ["32-true", "64-true", "16-true", "bf16-true", "16-mixed", "bf16-mixed"]
)
def test_each_precision_name_builds_lightnings_plugin_class(precision):
    lt, tt = both(accelerator="cpu", precision=precision)
    assert type(tt.precision_plugin).__name__ == type(lt.precision_plugin).__name__
    if precision != "16-mixed":  # Lightning runs 16-mixed as bf16-mixed on the CPU (docs/porting.md)
        assert tt.precision_plugin.precision == lt.precision_plugin.precision


@pytest.mark.parametrize("name", ["MixedPrecision", "HalfPrecision", "DoublePrecision", "FSDPPrecision"])
def test_plugin_methods_answer_as_lightnings(name):
    args = {
        "MixedPrecision": ("bf16-mixed", "cpu"),
        "HalfPrecision": ("bf16-true",),
        "FSDPPrecision": ("16-true",),
    }
    mine, real = getattr(ours, name)(*args.get(name, ())), getattr(theirs, name)(*args.get(name, ()))
    assert mine.precision == real.precision
    for context in ("forward_context", "module_init_context", "tensor_init_context"):
        seen = []
        for plugin in (mine, real):
            with getattr(plugin, context)():
                seen.append(
                    (torch.get_default_dtype(), torch.ones(1).dtype, torch.is_autocast_enabled("cpu"))
                )
            assert torch.get_default_dtype() is torch.float32
        assert seen[0] == seen[1], context
    for plugin in (mine, real):
        plugin.module = plugin.convert_module(torch.nn.Linear(2, 2))
    assert mine.module.weight.dtype == real.module.weight.dtype
    batch = {"x": torch.ones(2), "y": torch.arange(2)}
    out_mine, out_real = mine.convert_input(batch), real.convert_input(batch)
    assert {k: v.dtype for k, v in out_mine.items()} == {k: v.dtype for k, v in out_real.items()}


def test_double_precision_keeps_complex_buffers_as_lightning():
    for plugin in (ours.DoublePrecision(), theirs.DoublePrecision()):
        module = torch.nn.Linear(2, 2)
        module.register_buffer("c", torch.complex(torch.ones(2), torch.ones(2)))
        plugin.convert_module(module)
        assert module.weight.dtype is torch.float64 and module.c.dtype is torch.complex64


def test_constructors_refuse_what_lightnings_refuse():
    for cls, args in (("MixedPrecision", ("16", "cpu")), ("MixedPrecision", (16, "cpu"))):
        for module, expected in ((theirs, ValueError), (ours, ValueError)):
            with pytest.raises(expected):
                getattr(module, cls)(*args)
    refused = (ValueError, pl.utilities.exceptions.MisconfigurationException)
    for module in (theirs, ours):
        with pytest.raises(refused, match="does not use a scaler"):
            module.FSDPPrecision("bf16-mixed", scaler=mock.Mock())
        with pytest.raises(refused, match="does not use a scaler"):
            module.MixedPrecision("bf16-mixed", "cpu", scaler=mock.Mock())
    assert (
        ours.MixedPrecision("bf16-mixed", "cpu").scaler
        is None
        is theirs.MixedPrecision("bf16-mixed", "cpu").scaler
    )


def test_clip_gradients_dispatches_as_lightnings():
    for module in (theirs, ours):
        plugin = module.MixedPrecision("bf16-mixed", "cpu")
        plugin.clip_grad_by_value, plugin.clip_grad_by_norm = mock.Mock(), mock.Mock()
        plugin.clip_gradients(mock.Mock(_step_supports_amp_scaling=False), clip_val=0.0)
        assert not plugin.clip_grad_by_value.called and not plugin.clip_grad_by_norm.called
        plugin.clip_gradients(mock.Mock(_step_supports_amp_scaling=False), 1.0, "value")
        plugin.clip_gradients(mock.Mock(_step_supports_amp_scaling=False), 1.0, "norm")
        assert plugin.clip_grad_by_value.call_count == 1 and plugin.clip_grad_by_norm.call_count == 1
        with pytest.raises(RuntimeError, match="fused"):  # an optimizer that unscales inside its step
            module.MixedPrecision("16-mixed", "cpu").clip_gradients(
                mock.Mock(_step_supports_amp_scaling=True), 1.0
            )


@pytest.mark.parametrize(
    "plugins",
    [
        ["LightningEnvironment", "SLURMEnvironment"],
        ["Precision", "DoublePrecision", "LightningEnvironment", "SLURMEnvironment"],
        ["TorchSyncBatchNorm", "TorchSyncBatchNorm"],
    ],
)
def test_two_plugins_of_a_kind_are_refused_as_lightning(plugins):
    with pytest.raises(pl.utilities.exceptions.MisconfigurationException, match="multiple values"):
        pl.Trainer(plugins=[lightnings(n)() for n in plugins], **QUIET)
    with pytest.raises(TandemError, match="multiple values"):
        Trainer(plugins=[getattr(ours, n)() for n in plugins], **QUIET)


def test_other_refusals_are_lightnings():
    cases = [
        dict(plugins=["not a plugin"]),  # of no kind
        dict(precision="16-true", plugins=["Precision"]),  # the precision twice
        dict(sync_batchnorm=True, plugins=["Custom"]),  # a custom LayerSync with sync_batchnorm
    ]
    for case in cases:
        for module, errors in (
            (theirs, (ValueError, pl.utilities.exceptions.MisconfigurationException)),
            (ours, (TandemError,)),
        ):

            class Custom(module.LayerSync):
                def apply(self, model):
                    return model

                def revert(self, model):
                    return model

            names = {"Custom": Custom}
            plugins = [
                names[n]() if n in names else getattr(module, n)() if hasattr(module, n) else n
                for n in case["plugins"]
            ]
            make = pl.Trainer if module is theirs else Trainer
            with pytest.raises(errors):
                make(**{**case, "plugins": plugins}, **QUIET)


def test_sync_batchnorm_and_a_torch_sync_batchnorm_plugin_agree():
    for sync, plugins in ((True, []), (False, ["TorchSyncBatchNorm"]), (True, ["TorchSyncBatchNorm"])):
        lt = pl.Trainer(
            accelerator="cpu",
            strategy="ddp",
            sync_batchnorm=sync,
            plugins=[getattr(theirs, n)() for n in plugins],
            **QUIET,
        )
        tt = Trainer(
            accelerator="cpu",
            strategy="ddp",
            sync_batchnorm=sync,
            plugins=[getattr(ours, n)() for n in plugins],
            **QUIET,
        )
        assert (
            type(tt.strategy.layer_sync).__name__
            == type(lt.strategy._layer_sync).__name__
            == "TorchSyncBatchNorm"
        )


ENVIRONMENTS = {
    "slurm": {"SLURM_NTASKS": "4", "SLURM_NTASKS_PER_NODE": "2", "SLURM_JOB_NAME": "job", "SLURM_NODEID": "1",
              "SLURM_PROCID": "3", "SLURM_LOCALID": "1"},
    "torchelastic": {"TORCHELASTIC_RUN_ID": "1", "WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "1", "GROUP_RANK": "1",
                     "LOCAL_WORLD_SIZE": "2"},
    "torchelastic in slurm": {"TORCHELASTIC_RUN_ID": "1", "SLURM_NTASKS": "4", "WORLD_SIZE": "4", "RANK": "3",
                              "LOCAL_RANK": "1", "GROUP_RANK": "1", "LOCAL_WORLD_SIZE": "2"},
    "started by hand": {"LOCAL_RANK": "1", "NODE_RANK": "1", "WORLD_SIZE": "8"},
    "interactive slurm": {"SLURM_NTASKS": "4", "SLURM_JOB_NAME": "bash", "SLURM_PROCID": "3"},
    "none": {},
}  # fmt: skip


@pytest.mark.parametrize("case", list(ENVIRONMENTS))
@pytest.mark.parametrize("strategy", ["ddp", "instance"])
def test_the_environment_and_ranks_come_from_the_variables_as_in_lightning(case, strategy):
    seen = []
    with (
        mock.patch.dict(os.environ, ENVIRONMENTS[case]),
        mock.patch.object(torch.cuda, "is_available", lambda: False),
    ):
        for make, ddp in ((pl.Trainer, pl.strategies.DDPStrategy), (Trainer, DDPStrategy)):
            t = make(
                accelerator="cpu",
                devices=2,
                num_nodes=2,
                strategy=ddp() if strategy == "instance" else "ddp",
                **QUIET,
            )
            env = t.strategy.cluster_environment
            seen.append((type(env).__name__, t.global_rank, t.local_rank, t.node_rank, t.world_size))
    assert seen[0] == seen[1]


def test_kubeflow_is_taken_from_plugins_as_in_lightning():
    variables = {"KUBERNETES_PORT": "tcp://127.0.0.1:443", "MASTER_ADDR": "1.2.3.4", "MASTER_PORT": "500",
                 "WORLD_SIZE": "4", "RANK": "1"}  # fmt: skip
    seen = []
    with mock.patch.dict(os.environ, variables):
        for make, module in ((pl.Trainer, their_envs), (Trainer, ours)):
            t = make(
                accelerator="cpu",
                devices=1,
                num_nodes=4,
                strategy="ddp",
                plugins=[module.KubeflowEnvironment()],
                **QUIET,
            )
            env = t.strategy.cluster_environment
            seen.append(
                (
                    type(env).__name__,
                    env.main_address,
                    env.main_port,
                    t.global_rank,
                    t.local_rank,
                    t.node_rank,
                )
            )
    assert seen[0] == seen[1]


def test_strategy_registry_entries_are_lightnings():
    theirs_registry = pl.strategies.StrategyRegistry
    for name in ("ddp", "ddp_spawn", "ddp_fork", "ddp_notebook", "ddp_find_unused_parameters_true",
                 "ddp_spawn_find_unused_parameters_false", "fsdp"):  # fmt: skip
        assert name in StrategyRegistry and name in theirs_registry
        assert StrategyRegistry[name]["init_params"] == theirs_registry[name]["init_params"], name
        assert StrategyRegistry[name]["strategy"].__name__ == theirs_registry[name]["strategy"].__name__
    StrategyRegistry.register("ddp_big_buckets", DDPStrategy, description="100 MB buckets", bucket_cap_mb=100)
    try:
        t = Trainer(
            strategy="DDP_Big_Buckets", accelerator="cpu", devices=2, **QUIET
        )  # names are case-insensitive
        assert isinstance(t.strategy, DDPStrategy) and t.strategy.bucket_cap_mb == 100
        with pytest.raises(TandemError, match="override=True"):
            StrategyRegistry.register("ddp_big_buckets", DDPStrategy)
    finally:
        StrategyRegistry.remove("ddp_big_buckets")
    assert "ddp_big_buckets" not in StrategyRegistry


def test_strategy_keywords_and_parallel_devices_as_lightnings():
    seen = []
    for make, ddp, module in ((pl.Trainer, pl.strategies.DDPStrategy, theirs), (Trainer, DDPStrategy, ours)):
        t = make(
            strategy=ddp(
                parallel_devices=[torch.device("cpu")] * 3, precision_plugin=module.DoublePrecision()
            ),
            **QUIET,
        )
        seen.append((t.strategy.num_processes, [d.type for d in t.strategy.parallel_devices], t.precision_plugin.precision,
                     type(t.accelerator).__name__))  # fmt: skip
        with pytest.raises((ValueError, pl.utilities.exceptions.MisconfigurationException)):
            make(
                strategy=ddp(precision_plugin=module.DoublePrecision()), plugins=[module.Precision()], **QUIET
            )
    assert seen[0] == seen[1]


class Tiny(Task):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))

    def training_step(self, batch, batch_idx):
        return self.net(batch[0]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit(**kwargs: Any) -> torch.Tensor:
    task = Tiny()
    data = DataLoader(
        TensorDataset(torch.randn(16, 4, generator=torch.Generator().manual_seed(1))), batch_size=4
    )
    Trainer(accelerator="cpu", max_epochs=1, **kwargs, **QUIET).fit(task, data)
    return torch.cat([p.detach().flatten().double() for p in task.parameters()])


def test_a_precision_plugin_is_the_run_its_name_gives():
    assert torch.equal(_fit(plugins=[ours.MixedPrecision("bf16-mixed", "cpu")]), _fit(precision="bf16-mixed"))
    assert torch.equal(_fit(plugins=ours.DoublePrecision()), _fit(precision="64-true"))


def test_a_plugin_override_the_loop_never_calls_is_refused():
    class Mine(ours.Precision):
        def pre_backward(self, tensor, module):
            return tensor

    with pytest.raises(TandemError, match="pre_backward"):
        Trainer(plugins=[Mine()], **QUIET)


def test_a_layer_sync_plugin_is_applied_for_fit_and_reverted_as_in_lightning(tmp_path):
    calls: dict[str, list[str]] = {}
    for side, module, make, base in (
        ("lightning", theirs, pl.Trainer, pl.LightningModule),
        ("tandem", ours, Trainer, Task),
    ):
        log = calls.setdefault(side, [])

        class Recording(module.LayerSync):
            def __init__(self, log: list[str]) -> None:
                self.log = log

            def apply(self, model):
                self.log.append(f"apply {type(model.norm).__name__}")
                return model

            def revert(self, model):
                self.log.append("revert")
                return model

        class Net(base):
            def __init__(self):
                super().__init__()
                self.norm = torch.nn.BatchNorm1d(4)

            def training_step(self, batch, batch_idx):
                return self.norm(batch[0]).pow(2).mean()

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1)

        data = DataLoader(TensorDataset(torch.randn(8, 4)), batch_size=4)
        trainer = make(accelerator="cpu", devices=1, strategy="ddp", plugins=[Recording(log)], max_steps=1,
                       default_root_dir=tmp_path / side, **QUIET)  # fmt: skip
        trainer.fit(Net(), data)
    assert calls["tandem"] == calls["lightning"] == ["apply BatchNorm1d", "revert"]


def test_torch_sync_batchnorm_converts_for_the_device_and_reverts_with_the_statistics():
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    net(torch.randn(8, 3))  # statistics to keep
    stats = net[1].running_mean.clone()
    synced = ours.TorchSyncBatchNorm().apply(net)  # on the CPU: strategies/syncbn.py's GroupBatchNorm
    assert type(synced[1]).__name__ == "GroupBatchNorm" and torch.equal(synced[1].running_mean, stats)
    plain = ours.TorchSyncBatchNorm().revert(synced)
    assert (
        isinstance(plain[1], torch.nn.modules.batchnorm._BatchNorm)
        and type(plain[1]).__name__ == "_BatchNormXd"
    )
    assert torch.equal(plain[1].running_mean, stats)
    x = torch.randn(5, 3)
    plain.eval(), net.eval()
    assert torch.allclose(plain(x), net(x))
