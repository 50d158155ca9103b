"""The Task's inference and export methods (trainer/task/export.py): freeze/unfreeze, example_input_array,
to_torchscript (script and trace) and to_onnx (its graph evaluated by onnx's reference evaluator)."""

from __future__ import annotations

import pytest
import torch

from tandem_core.errors import ConfigError
from trainer import Task


class Mlp(Task):
    def __init__(self) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.body = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU())
        self.head = torch.nn.Linear(8, 3)
        self.example_input_array = torch.randn(4, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def test_freeze_and_unfreeze():
    task = Mlp()
    assert task.freeze() is task and not task.training
    assert not any(p.requires_grad for p in task.parameters())
    task.unfreeze()
    assert task.training and all(p.requires_grad for p in task.parameters())


def test_example_input_array_is_a_plain_attribute():
    task = Mlp()
    assert task.example_input_array.shape == (4, 6) and "example_input_array" not in dict(
        task.named_buffers()
    )
    task.example_input_array = None
    with pytest.raises(ConfigError, match="example_input_array"):
        task.to_torchscript(method="trace")


@pytest.mark.parametrize("method", ["script", "trace"])
def test_to_torchscript_computes_what_the_task_computes(tmp_path, method):
    task = Mlp()
    task.train()
    path = tmp_path / "m.pt"
    module = task.to_torchscript(file_path=path, method=method)
    assert task.training  # its mode is given back
    x = torch.randn(5, 6)
    task.eval()
    expected = task(x)
    assert torch.equal(module(x), expected) and torch.equal(torch.jit.load(str(path))(x), expected)


def test_to_onnx_writes_a_model_that_computes_the_same(tmp_path):
    onnx = pytest.importorskip("onnx", reason="the export extra: pip install 'tandem-trainer[export]'")
    from onnx.reference import ReferenceEvaluator

    task = Mlp().eval()
    path = tmp_path / "m.onnx"
    task.to_onnx(path)
    model = onnx.load(str(path))
    onnx.checker.check_model(model)
    x = task.example_input_array
    (got,) = ReferenceEvaluator(model).run(None, {model.graph.input[0].name: x.numpy()})
    assert torch.allclose(torch.from_numpy(got), task(x).detach(), atol=1e-5)
