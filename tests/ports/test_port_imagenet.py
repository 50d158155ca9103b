"""imagenet.py (BatchNorm, benchmark=True, sync_batchnorm=True, ParallelStrategy checks, rank_zero_only,
([optimizer], [scheduler]) from configure_optimizers) against a hand loop on one process. The two-process
run against the same loop on the global batch is in test_port_ddp.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from tests.ports.harness import QUIET, LazyPort, assert_same_weights, seed_all, weights

imagenet = LazyPort("imagenet")

EPOCHS = 3


def reference() -> tuple[dict[str, torch.Tensor], float]:
    seed_all(0)
    net = imagenet.small_convnet()
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda epoch: 0.1 ** (epoch // 2))
    train = DataLoader(imagenet.digit_images(0, 1024), batch_size=32, shuffle=True)
    val = DataLoader(imagenet.digit_images(1024, 1280), batch_size=32)
    acc = 0.0
    for _ in range(EPOCHS):
        for x, y in train:
            loss = F.cross_entropy(net(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        sched.step()
        net.eval()
        with torch.no_grad():
            correct = sum(int((net(x).argmax(1) == y).sum()) for x, y in val)
        net.train()
        acc = correct / 256
    return weights(net), acc


@pytest.fixture
def restore_cudnn_flags():
    saved, deterministic = torch.backends.cudnn.benchmark, torch.are_deterministic_algorithms_enabled()
    yield
    torch.backends.cudnn.benchmark = saved
    torch.use_deterministic_algorithms(deterministic)


def test_imagenet_template_ends_with_the_hand_loops_weights(tmp_path, restore_cudnn_flags, capsys):
    torch.backends.cudnn.benchmark = False
    out = imagenet.main(default_root_dir=str(tmp_path), **QUIET)
    expected, acc = reference()
    assert_same_weights(weights(out["model"], "model."), expected)
    # on one device the strategy is not a ParallelStrategy: the counts are this process's, all 256 images
    assert not isinstance(out["trainer"].strategy, imagenet.ParallelStrategy)
    assert out["model"].val_samples_seen == 256
    assert float(out["trainer"].callback_metrics["val_acc_global"]) == pytest.approx(acc, abs=1e-6)
    assert "global val acc" in capsys.readouterr().out  # rank_zero_only runs the report on rank 0
    assert torch.backends.cudnn.benchmark is True  # Trainer(benchmark=True) sets torch's flag


def test_benchmark_defaults_to_off_when_deterministic(tmp_path, restore_cudnn_flags):
    torch.backends.cudnn.benchmark = True
    imagenet.Trainer(accelerator="cpu", deterministic=True, logger=False, **QUIET)
    assert torch.backends.cudnn.benchmark is False
