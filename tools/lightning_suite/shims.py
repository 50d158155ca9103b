"""Test infrastructure for the Tandem run (Lightning's conftest.py and helpers/runif.py import Lightning internals, so
the runner passes --noconftest and supplies these instead). Written for the runner; it is not part of the alias."""

from __future__ import annotations

import os
import signal
import sys
import types
from typing import Any

import pytest
import torch


def RunIf(**kwargs: Any) -> pytest.MarkDecorator:  # noqa: N802 (Lightning's name)
    """Lightning's own skip conditions (hardware, packages, versions, standalone), computed by the installed
    Lightning's `_runif_reasons`: facts about this machine, the same in both runs, so that a test runs under Tandem
    exactly when it runs under Lightning."""
    from pytorch_lightning.utilities.testing._runif import _runif_reasons

    reasons, marker_kwargs = _runif_reasons(**kwargs)
    return pytest.mark.skipif(
        condition=len(reasons) > 0, reason=f"Requires: [{' + '.join(reasons)}]", **marker_kwargs
    )


def install() -> None:
    module = types.ModuleType("tests_pytorch.helpers.runif")
    module.RunIf = RunIf  # type: ignore[attr-defined]
    # Lightning's marker for gloo cases that fail on Windows only: nothing on this platform
    module._xfail_gloo_windows = pytest.mark.xfail(  # type: ignore[attr-defined]
        RuntimeError, strict=True, condition=sys.platform == "win32", reason="gloo on Windows"
    )
    sys.modules["tests_pytorch.helpers.runif"] = module
    # tests import conftest's helpers by name (`from tests_pytorch.conftest import mock_cuda_count`): the same
    # pretences on torch's public API, which Tandem reads (Lightning's conftest patches its own internals)
    conftest = types.ModuleType("tests_pytorch.conftest")
    conftest.mock_cuda_count = _cuda_count  # type: ignore[attr-defined]
    conftest.mock_mps_count = _mps_count  # type: ignore[attr-defined]
    conftest.mock_xla_available = _no_xla  # type: ignore[attr-defined]
    conftest.mock_tpu_available = _no_xla  # type: ignore[attr-defined]
    sys.modules["tests_pytorch.conftest"] = conftest


@pytest.fixture(autouse=True)
def _restore_environment() -> Any:
    """What Lightning's conftest restores after each test: the environment, the signal handlers, torch's
    determinism and the process group (so that one test's leftovers never decide another's result)."""
    env = dict(os.environ)
    handlers = {s: signal.getsignal(s) for s in signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP}}
    yield
    os.environ.clear()
    os.environ.update(env)
    for signum, handler in handlers.items():
        if handler is not None:
            signal.signal(signum, handler)
    torch.use_deterministic_algorithms(False)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


# tests/tests_pytorch/loggers/conftest.py mocks the trackers' own packages (wandb, mlflow, ...) and imports nothing
# of Lightning: its fixtures serve the Tandem run as they are (--noconftest would otherwise hide them)
try:
    from tests_pytorch.loggers.conftest import comet_mock, litlogger_mock, mlflow_mock, wandb_mock  # noqa: F401
except ImportError:  # another Lightning version: the tests that need them fail on the missing fixture
    pass


@pytest.fixture
def datadir() -> Any:
    from tests_pytorch import _PATH_DATASETS

    return _PATH_DATASETS


def _cuda_count(monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)


def _mps_count(monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: n > 0)


def _no_xla(*_: Any, **__: Any) -> None:
    pytest.skip("needs XLA (pretended by Lightning's conftest through its internals)")


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
def mps_count_0(monkeypatch: pytest.MonkeyPatch) -> None:
    _mps_count(monkeypatch, 0)


@pytest.fixture
def mps_count_1(monkeypatch: pytest.MonkeyPatch) -> None:
    _mps_count(monkeypatch, 1)


@pytest.fixture
def xla_available() -> None:
    pytest.skip("needs XLA")


@pytest.fixture
def tpu_available() -> None:
    pytest.skip("needs a TPU")


@pytest.fixture
def tmpdir_server(tmp_path: Any) -> Any:
    """An HTTP server on a free local port serving `tmp_path` (Lightning's tests load checkpoints from URLs);
    yields its (host, port)."""
    import functools
    import http.server
    import threading

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    with http.server.ThreadingHTTPServer(("localhost", 0), handler) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        yield server.server_address
        server.shutdown()
        thread.join()


@pytest.fixture
def single_process_pg() -> Any:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    torch.distributed.destroy_process_group()
