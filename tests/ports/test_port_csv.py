"""CSVLogger's metrics.csv as Lightning writes it (run on Lightning too by lightning_check): the step column is
the optimizer steps taken before the logged one (global_step - 1), epoch an int, one row per log call (two
test() runs are two rows), and a run resumed into the same version keeps the earlier rows."""

from __future__ import annotations

import csv
import os
from typing import Any

from tests.ports.harness import QUIET
from tests.ports.hookrec import Boring
from trainer import Trainer
from trainer.loggers import CSVLogger


class Logs(Boring):
    def training_step(self, batch: Any, batch_idx: int) -> Any:
        out = super().training_step(batch, batch_idx)
        self.log("train_loss", out["loss"])
        return out

    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        out = super().validation_step(batch, batch_idx)
        self.log("val_loss", out["x"])
        return out

    def test_step(self, batch: Any, batch_idx: int) -> Any:
        out = super().test_step(batch, batch_idx)
        self.log("test_loss", out["y"])
        return out


def rows(logger: CSVLogger) -> list[dict[str, str]]:
    with open(os.path.join(logger.log_dir, "metrics.csv"), newline="") as f:
        return [{k: v for k, v in row.items() if v != ""} for row in csv.DictReader(f)]


def _trainer(tmp_path: Any, logger: CSVLogger, **kwargs: Any) -> Trainer:
    opts = dict(max_epochs=2, limit_train_batches=4, limit_val_batches=2, limit_test_batches=2,
                log_every_n_steps=2, num_sanity_val_steps=0, enable_checkpointing=False)  # fmt: skip
    return Trainer(default_root_dir=str(tmp_path), logger=logger, **{**opts, **kwargs}, **QUIET)


def test_steps_epochs_and_rows_as_lightning(tmp_path):
    logger = CSVLogger(str(tmp_path), name="csv", version=0)
    trainer = _trainer(tmp_path, logger)
    task = Logs()
    trainer.fit(task)
    trainer.test(task, verbose=False)
    trainer.test(task, verbose=False)
    table = rows(logger)
    train = [(r["step"], r["epoch"]) for r in table if "train_loss" in r]
    assert train == [("1", "0"), ("3", "0"), ("5", "1"), ("7", "1")]
    val = [(r["step"], r["epoch"]) for r in table if "val_loss" in r]
    assert val == [("3", "0"), ("7", "1")]
    tests = [(r["step"], r["epoch"]) for r in table if "test_loss" in r]
    assert tests == [("8", "2"), ("8", "2")]  # two test() runs: two rows, at the fit's step count


def test_a_resumed_run_appends_to_its_metrics_file(tmp_path):
    first = CSVLogger(str(tmp_path), name="csv", version=0)
    trainer = _trainer(tmp_path, first, max_epochs=1, enable_checkpointing=True)
    trainer.fit(Logs())
    path = trainer.checkpoint_callback.best_model_path
    before = rows(first)
    again = CSVLogger(str(tmp_path), name="csv", version=0)
    _trainer(tmp_path, again, max_epochs=2, enable_checkpointing=True).fit(Logs(), ckpt_path=path)
    after = rows(again)
    assert after[: len(before)] == before  # nothing of the first run lost
    assert [r["step"] for r in after if "train_loss" in r] == ["1", "3", "5", "7"]
