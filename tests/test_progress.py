"""TQDMProgressBar: what it prints, and the promise that a step which writes nothing synchronizes nothing."""

from __future__ import annotations

import time

import pytest
import torch
from callback_tasks import Scored, loader

from callbacks import Callback, TQDMProgressBar
from trainer import Trainer


def test_progress_bar_prints_epochs_metrics_and_validation(tmp_path, capsys):
    Trainer(max_epochs=2, default_root_dir=str(tmp_path), logger=False, enable_model_summary=False).fit(
        Scored(), loader(), loader(2, 2)
    )
    out = capsys.readouterr().out
    assert "Epoch 0" in out and "Epoch 1" in out and "train/loss=" in out and "val/score=0" in out
    assert "Sanity Checking" in out and "Validation" in out


def test_the_bar_counts_every_batch_also_when_it_does_not_draw(tmp_path):
    seen = []

    class Probe(Callback):
        def on_train_batch_end(self, trainer, task, outputs, batch, batch_idx):
            seen.append(trainer.progress_bar_callback.train_progress_bar.n)

    bar = TQDMProgressBar(min_interval_s=60.0)  # draws at the start and the end only
    trainer = Trainer(
        max_epochs=1, default_root_dir=str(tmp_path), logger=False, enable_model_summary=False,
        num_sanity_val_steps=0, callbacks=[bar, Probe()],
    )  # fmt: skip
    trainer.fit(Scored(), loader(n=12, batch_size=2))
    assert seen == [1, 2, 3, 4, 5, 6]  # the bar's count is exact after each batch, as Lightning's


# ----- no host synchronization on steps that write nothing -------------------------------------------------
SYNCS = ("item", "tolist", "__float__", "__int__", "__bool__", "cpu", "numpy", "__format__")


@pytest.fixture
def sync_counter(monkeypatch):
    """Counts every Tensor method that copies a value to the host (a device synchronization on a GPU)."""
    count = [0]
    for name in SYNCS:
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _original=original, **kwargs):
            count[0] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    return count


class PerBatchSyncs(Callback):
    def __init__(self, count):
        self.count, self.marks = count, []

    def on_train_batch_start(self, trainer, task, batch, batch_idx):
        self.marks.append(self.count[0])

    def per_batch(self) -> list[int]:  # syncs of batch i: from its start to the next batch's start
        return [b - a for a, b in zip(self.marks, self.marks[1:])]


class Logs(Scored):
    def training_step(self, batch, batch_idx):
        loss = self.net(batch[0]).pow(2).mean()
        self.log("train/loss", loss, prog_bar=True, on_epoch=True)
        self.log("train/lr", 0.1)
        return loss


def test_steps_that_write_nothing_do_not_synchronize(tmp_path, sync_counter):
    probe = PerBatchSyncs(sync_counter)
    trainer = Trainer(
        max_epochs=1,
        log_every_n_steps=10,
        default_root_dir=str(tmp_path),
        num_sanity_val_steps=0,
        callbacks=[probe, TQDMProgressBar(refresh_rate=4, min_interval_s=0.0)],
    )
    trainer.fit(Logs(), loader(n=40, batch_size=1))
    per_batch = probe.per_batch()  # batches 0..38; batch i ends at global step i + 1
    writes = {i for i in range(39) if (i + 1) % 10 == 0 or (i + 1) % 4 == 0}
    assert {i for i, n in enumerate(per_batch) if n} == writes
    assert all(per_batch[i] > 0 for i in (9, 19, 29))  # the counter does see the logging steps


def test_default_progress_bar_converts_at_most_ten_times_a_second(tmp_path, sync_counter):
    probe = PerBatchSyncs(sync_counter)
    trainer = Trainer(
        max_epochs=1,
        log_every_n_steps=50,
        default_root_dir=str(tmp_path),
        num_sanity_val_steps=0,
        callbacks=[probe],
    )  # defaults: TensorBoard, TQDMProgressBar(refresh_rate=1), checkpointing
    start = time.monotonic()
    trainer.fit(Logs(), loader(n=200, batch_size=1))
    elapsed = time.monotonic() - start
    syncing = [i for i, n in enumerate(probe.per_batch()) if n]
    logging = [i for i in syncing if (i + 1) % 50 == 0]
    assert len(logging) == 3
    assert len(syncing) - len(logging) <= elapsed / 0.1 + 2
