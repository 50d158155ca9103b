"""Test infrastructure for the Tandem run (Lightning's conftest.py and helpers/runif.py import Lightning internals, so
the runner passes --noconftest and supplies these instead). Written for the runner; it is not part of the alias."""

from __future__ import annotations

import importlib.util
import os
import sys
import types
from typing import Any

import pytest
import torch

_NEEDS_HARDWARE = ("min_cuda_gpus", "tpu", "bf16_cuda", "deepspeed", "standalone", "mps", "xla")
_PACKAGES = {
    "rich": "rich",
    "sklearn": "sklearn",
    "omegaconf": "omegaconf",
    "onnx": "onnx",
    "tensorboard": "tensorboard",
}


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split("+")[0].split(".")[:3] if p.isdigit())


def RunIf(**kwargs: Any) -> pytest.MarkDecorator:  # noqa: N802 (Lightning's name)
    """Skip on the conditions Lightning's RunIf checks that matter on a CPU-only machine."""
    reasons = [k for k in _NEEDS_HARDWARE if kwargs.get(k)]
    reasons += [k for k, mod in _PACKAGES.items() if kwargs.get(k) and importlib.util.find_spec(mod) is None]
    torch_v = _version(torch.__version__)
    if kwargs.get("min_torch") and torch_v < _version(kwargs["min_torch"]):
        reasons.append("min_torch")
    if kwargs.get("max_torch") and torch_v >= _version(kwargs["max_torch"]):
        reasons.append("max_torch")
    return pytest.mark.skipif(bool(reasons), reason=f"requires {', '.join(reasons)}")


def install() -> None:
    module = types.ModuleType("tests_pytorch.helpers.runif")
    module.RunIf = RunIf  # type: ignore[attr-defined]
    # Lightning's xfail for gloo on Windows (test_train_loop_logging.py): never on this Linux machine
    module._xfail_gloo_windows = pytest.mark.xfail(False, reason="gloo on Windows")  # type: ignore[attr-defined]
    sys.modules["tests_pytorch.helpers.runif"] = module


@pytest.fixture(autouse=True)
def _restore_environment() -> Any:
    env = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(env)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


@pytest.fixture
def datadir() -> Any:
    from tests_pytorch import _PATH_DATASETS

    return _PATH_DATASETS


def _cuda_count(monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)


@pytest.fixture
def cuda_count_0(monkeypatch: pytest.MonkeyPatch) -> None:
    _cuda_count(monkeypatch, 0)


@pytest.fixture
def cuda_count_1(monkeypatch: pytest.MonkeyPatch) -> None:
    _cuda_count(monkeypatch, 1)


@pytest.fixture
def cuda_count_2(monkeypatch: pytest.MonkeyPatch) -> None:
    _cuda_count(monkeypatch, 2)


@pytest.fixture
def cuda_count_4(monkeypatch: pytest.MonkeyPatch) -> None:
    _cuda_count(monkeypatch, 4)


@pytest.fixture
def mps_count_0() -> None:
    pass


@pytest.fixture
def mps_count_1() -> None:
    pytest.skip("needs MPS")


@pytest.fixture
def xla_available() -> None:
    pytest.skip("needs XLA")


@pytest.fixture
def tpu_available() -> None:
    pytest.skip("needs a TPU")


@pytest.fixture
def tmpdir_server() -> None:
    pytest.skip("needs Lightning's HTTP test server")


@pytest.fixture
def single_process_pg() -> Any:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    torch.distributed.destroy_process_group()
