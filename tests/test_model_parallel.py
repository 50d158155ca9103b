"""ModelParallelStrategy's arguments, Lightning's "auto" rules and its refusals, without starting processes
(the multi-process behaviour: tests/test_model_parallel_fit.py)."""

from __future__ import annotations

import datetime

import pytest
import torch

import strategies
from strategies import resolve_strategy
from strategies.model_parallel import ModelParallelStrategy, mesh_shape
from tandem_core.errors import ConfigError, TaskError
from trainer import Task, Trainer
from trainer.config import build_trainer


def test_auto_sizes_follow_lightning():
    # "auto": data parallel = nodes, tensor parallel = processes per node
    assert mesh_shape("auto", "auto", devices=4, nodes=1) == (1, 4)
    assert mesh_shape("auto", "auto", devices=2, nodes=3) == (3, 2)
    assert mesh_shape(2, 2, devices=4, nodes=1) == (2, 2)
    assert mesh_shape(4, 1, devices=4, nodes=1) == (4, 1)
    assert mesh_shape(1, 1, devices=1, nodes=1) == (1, 1)
    assert mesh_shape("auto", 4, devices=4, nodes=1) == (1, 4)


@pytest.mark.parametrize(
    ("dp", "tp", "devices", "nodes"), [(3, 2, 4, 1), (2, "auto", 4, 1), ("auto", 3, 4, 2)]
)
def test_sizes_whose_product_is_not_the_world_size_are_refused(dp, tp, devices, nodes):
    with pytest.raises(ConfigError, match=rf"world size is {devices * nodes} .*product is {devices * nodes}"):
        mesh_shape(dp, tp, devices, nodes)


@pytest.mark.parametrize("value", [0, -1, "two", 1.5, True, None])
def test_sizes_must_be_auto_or_positive_ints(value):
    with pytest.raises(ConfigError, match="must be 'auto' or a positive int"):
        ModelParallelStrategy(data_parallel_size=value)
    with pytest.raises(ConfigError, match="must be 'auto' or a positive int"):
        ModelParallelStrategy(tensor_parallel_size=value)


def test_lightning_defaults_and_names():
    s = ModelParallelStrategy()
    assert (s.data_parallel_size, s.tensor_parallel_size, s.save_distributed_checkpoint) == (
        "auto",
        "auto",
        True,
    )
    assert s.name == "model_parallel" and s.timeout_s == 1800.0 and s.backend is None
    assert (
        not s.checkpoint_io.full
        and ModelParallelStrategy(save_distributed_checkpoint=False).checkpoint_io.full
    )
    assert ModelParallelStrategy(timeout=datetime.timedelta(seconds=42)).timeout_s == 42.0
    assert ModelParallelStrategy(process_group_backend="gloo").backend == "gloo"
    assert strategies.ModelParallelStrategy is ModelParallelStrategy


def test_the_name_and_the_trainer_fill_devices_and_nodes():
    options = {"devices": 4, "num_nodes": 1, "accelerator": "cpu"}
    s = resolve_strategy("model_parallel", options, {"devices", "accelerator"})
    assert isinstance(s, ModelParallelStrategy) and s.mesh_shape == (1, 4)
    s = resolve_strategy(ModelParallelStrategy(2, 2), options, {"devices", "accelerator"})
    assert s.mesh_shape == (2, 2)
    bad = resolve_strategy(ModelParallelStrategy(3, 2), options, {"devices", "accelerator"})
    with pytest.raises(ConfigError, match="gives a 3 x 2 mesh, but the world size is 4"):
        bad.launch()  # before any process starts


def test_a_config_file_names_it(tmp_path):
    path = tmp_path / "mp.yaml"
    path.write_text(
        "trainer:\n  strategy: model_parallel\n  devices: 2\n  accelerator: cpu\n  logger: false\n"
    )
    trainer = build_trainer(str(path))
    assert isinstance(trainer.strategy, ModelParallelStrategy) and trainer.strategy.mesh_shape == (1, 2)
    path.write_text(
        "trainer:\n  devices: 2\n  accelerator: cpu\n  logger: false\n  strategy:\n"
        "    _target_: strategies.model_parallel.ModelParallelStrategy\n"
        "    data_parallel_size: 2\n    tensor_parallel_size: 1\n"
    )
    trainer = build_trainer(str(path))
    assert trainer.strategy.mesh_shape == (2, 1)


class NoConfigureModel(Task):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 2)


def test_a_task_without_configure_model_is_refused():
    with pytest.raises(TaskError, match=r"needs NoConfigureModel.configure_model\(\).*parallelize_module"):
        ModelParallelStrategy().setup(NoConfigureModel())


def test_16_mixed_is_refused():
    trainer = Trainer(
        strategy="model_parallel", precision="16-mixed", devices=1, accelerator="cpu", logger=False
    )
    with pytest.raises(ConfigError, match="'16-mixed'.*bf16-mixed"):
        trainer.strategy.setup(NoConfigureModel())


def test_on_cuda_a_model_mixing_dtensor_and_plain_parameters_is_refused_at_setup(monkeypatch):
    """The GPU check found it (docs/benchmarks.md, "On a GPU"): torch's optimizers step CUDA parameters with
    foreach ops, which refuse a list mixing DTensors and plain tensors. Refused at setup with the fix; the CPU,
    where the optimizers do not use foreach, keeps training such a model. DTensor is stood in by a Parameter
    subclass and the device by cuda:0 (nothing is allocated there)."""
    from types import SimpleNamespace

    import torch.distributed.tensor as dtensor

    class StandIn(torch.nn.Parameter):
        pass

    monkeypatch.setattr(dtensor, "DTensor", StandIn)
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    model[0].weight = StandIn(model[0].weight.data)
    model[0].bias = StandIn(model[0].bias.data)
    strategy = ModelParallelStrategy(1, 1)
    strategy.device_mesh = {"data_parallel": SimpleNamespace(size=lambda: 1)}
    strategy._root_device = torch.device("cuda", 0)
    with pytest.raises(TaskError, match=r"\['1.weight', '1.bias'\] are plain tensors.*fully_shard\(self"):
        strategy._check_data_parallel(model)
    strategy._root_device = torch.device("cpu")
    strategy._check_data_parallel(model)  # the CPU: allowed
    for p in model[1].parameters():
        p.__class__ = StandIn
    strategy._root_device = torch.device("cuda", 0)
    strategy._check_data_parallel(model)  # every parameter a DTensor: allowed
