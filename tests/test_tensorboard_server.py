"""A real `tensorboard --logdir` server reads a run written by TensorBoardLogger (HTTP API on 127.0.0.1)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest
import torch
from test_loggers import Recorder, data
from torch.utils.data import DataLoader

from trainer import Trainer
from trainer.loggers import TensorBoardLogger

STARTUP_TIMEOUT_S = 60.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str) -> object:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read().decode())


def test_tensorboard_server_serves_the_logged_scalars(tmp_path):
    pytest.importorskip("tensorboard")
    task = Recorder()
    logger = TensorBoardLogger(str(tmp_path), name="exp")
    trainer = Trainer(
        max_epochs=2,
        log_every_n_steps=1,
        logger=logger,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    trainer.fit(task, DataLoader(data(10), batch_size=4), DataLoader(data(7, seed=1), batch_size=3))

    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "tensorboard.main",
        "--logdir",
        str(tmp_path),
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
        "--load_fast=false",
        "--reload_interval=1",
    ]
    log = open(tmp_path / "tensorboard.log", "w")
    proc = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    )
    base = f"http://127.0.0.1:{port}"
    run = "exp/version_0"
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        tags: dict = {}
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(
                    f"tensorboard exited with {proc.returncode}: {(tmp_path / 'tensorboard.log').read_text()}"
                )
            try:
                tags = get_json(f"{base}/data/plugin/scalars/tags")  # type: ignore[assignment]
            except OSError:  # not listening yet
                tags = {}
            if "val/loss" in tags.get(run, {}):
                break
            time.sleep(0.25)
        assert "train/loss_step" in tags.get(run, {}), f"runs served: {tags}"
        query = urllib.parse.urlencode({"run": run, "tag": "train/loss_step"})
        points = get_json(f"{base}/data/plugin/scalars/scalars?{query}")  # [[wall_time, step, value], ...]
        # Lightning's step: the optimizer steps taken before the logged one
        assert [p[1] + 1 for p in points] == sorted(task.steps)  # type: ignore[index]
        for _, step, value in points:  # type: ignore[misc]
            assert value == pytest.approx(task.steps[step + 1], rel=1e-6)
        query = urllib.parse.urlencode({"run": run, "tag": "val/loss"})
        points = get_json(f"{base}/data/plugin/scalars/scalars?{query}")
        assert [p[1] for p in points] == [2, 5]  # type: ignore[index]
        assert points[-1][2] == pytest.approx(float(trainer.callback_metrics["val/loss"]), rel=1e-6)  # type: ignore[index]
    finally:
        proc.kill()
        proc.wait(timeout=10)
        log.close()
    assert torch.isfinite(trainer.callback_metrics["val/loss"])
