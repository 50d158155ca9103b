"""Issue 24: a run resumed into its TensorBoard version directory keeps the earlier history, and each step
shows once: what the interrupted run logged after its checkpoint is superseded by the resumed run's values
(trainer/loggers/tensorboard.py, read back with tensorboard's own EventAccumulator)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import FAST
from torch.utils.data import DataLoader, TensorDataset

from callbacks import ModelCheckpoint
from trainer import Task, Trainer
from trainer.loggers import TensorBoardLogger

pytest.importorskip("tensorboard")


class Crash(RuntimeError):
    pass


class Linear(Task):
    def __init__(self, crash_at: int = -1) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(4, 1)
        self.crash_at = crash_at

    def training_step(self, batch, batch_idx):
        if self.global_step == self.crash_at:
            raise Crash("node lost")
        x, y = batch
        loss = F.mse_loss(self.layer(x), y)
        self.log("loss", loss)
        self.log("run", float(self.crash_at))  # which run wrote a step: -1 the resumed one
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def fit(root, task: Task, ckpt_path: str | None = None, **kwargs) -> Trainer:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(32, 4, generator=g)
    logger = TensorBoardLogger(str(root), name="tb", version=0, flush_secs=1)
    trainer = Trainer(
        **{**FAST, "enable_checkpointing": True, "log_every_n_steps": 1, "logger": logger},
        callbacks=[ModelCheckpoint(every_n_train_steps=4, save_last=True, save_top_k=-1)],
        default_root_dir=str(root),
        max_steps=10,
        **kwargs,
    )
    trainer.fit(task, DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4), ckpt_path=ckpt_path)
    return trainer


def scalars(log_dir: str, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(log_dir)  # purge_orphaned_data=True, as TensorBoard's own reader
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


@pytest.mark.parametrize("how", ["auto", "ckpt_path"])
def test_a_resumed_run_keeps_the_history_and_each_step_once(tmp_path, how):
    with pytest.raises(Crash):
        fit(tmp_path, Linear(crash_at=6))  # checkpoint at step 4, steps 4 and 5 logged after it
    log_dir = str(tmp_path / "tb" / "version_0")
    before = scalars(log_dir, "run")
    assert [s for s, _ in before] == [0, 1, 2, 3, 4, 5]
    resumed = Linear()
    if how == "auto":
        trainer = fit(tmp_path, resumed, resume="auto")
    else:
        trainer = fit(
            tmp_path, resumed, ckpt_path=str(tmp_path / "tb" / "version_0" / "checkpoints" / "last.ckpt")
        )
    assert trainer.log_dir == log_dir
    after = scalars(log_dir, "run")
    assert [s for s, _ in after] == list(range(10))  # every step, none twice
    assert [v for _, v in after] == [6.0] * 4 + [-1.0] * 6  # 0-3 from the first run, 4-9 the resumed one's


def test_the_losses_match_an_uninterrupted_run(tmp_path):
    with pytest.raises(Crash):
        fit(tmp_path / "cut", Linear(crash_at=6))
    fit(tmp_path / "cut", Linear(), resume="auto")
    fit(tmp_path / "whole", Linear())
    cut = scalars(str(tmp_path / "cut" / "tb" / "version_0"), "loss")
    whole = scalars(str(tmp_path / "whole" / "tb" / "version_0"), "loss")
    assert [s for s, _ in cut] == [s for s, _ in whole] == list(range(10))
    torch.testing.assert_close([v for _, v in cut], [v for _, v in whole], rtol=0, atol=0)
