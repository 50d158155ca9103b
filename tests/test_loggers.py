"""TensorBoard and CSV loggers: event files read back with TensorBoard's own reader, CSV agreement, hparams."""

from __future__ import annotations

import csv
import math
import os

import pytest
import torch
import torch.nn.functional as F
import yaml
from torch.utils.data import DataLoader, TensorDataset

from trainer import Task, Trainer
from trainer.loggers import CSVLogger, TensorBoardLogger

QUIET = dict(enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False)


def data(n: int, seed: int = 0) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(n, 4, generator=g), torch.randint(0, 2, (n,), generator=g))


class Recorder(Task):
    """Logs train/loss (step and epoch) and val/loss, and keeps its own record of every value to compare."""

    def __init__(self, lr: float = 0.1, hidden: int = 8) -> None:
        super().__init__()
        self.save_hyperparameters()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(4, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 2)
        )
        self.steps: dict[int, float] = {}  # global step after the batch -> that batch's loss
        self.train_batches: dict[int, list[tuple[int, float]]] = {}  # epoch -> (batch size, loss)
        self.val_batches: dict[int, list[tuple[int, float]]] = {}

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("train/loss", loss, on_step=True, on_epoch=True, prog_bar=True)
        self.train_batches.setdefault(self.current_epoch, []).append((len(y), loss.item()))
        self.steps[self.global_step + 1] = loss.item()
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("val/loss", loss)
        if not self.trainer.sanity_checking:
            self.val_batches.setdefault(self.current_epoch, []).append((len(y), loss.item()))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


def weighted_mean(pairs: list[tuple[int, float]]) -> float:
    return sum(n * v for n, v in pairs) / sum(n for n, _ in pairs)


def fit_recorder(tmp_path, loggers, epochs: int = 2, every: int = 2) -> tuple[Recorder, Trainer]:
    task = Recorder()
    trainer = Trainer(
        max_epochs=epochs, log_every_n_steps=every, logger=loggers, default_root_dir=str(tmp_path), **QUIET
    )
    # 10 samples in batches of 4: 4, 4, 2 (uneven last batch); validation 7 samples in 3, 3, 1
    trainer.fit(task, DataLoader(data(10), batch_size=4), DataLoader(data(7, seed=1), batch_size=3))
    return task, trainer


def read_events(log_dir: str) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(log_dir, size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def read_csv(path: str) -> dict[str, list[tuple[int, float]]]:
    out: dict[str, list[tuple[int, float]]] = {}
    with open(path) as f:
        for row in csv.DictReader(f):
            for k, v in row.items():
                if k != "step" and v != "":
                    out.setdefault(k, []).append((int(row["step"]), float(v)))
    return out


def test_event_files_hold_each_tag_with_the_right_steps_and_values(tmp_path):
    task, trainer = fit_recorder(tmp_path, TensorBoardLogger(str(tmp_path), name="tb"))
    log_dir = os.path.join(str(tmp_path), "tb", "version_0")
    assert trainer.log_dir == log_dir
    scalars = read_events(log_dir)
    assert {"train/loss_step", "train/loss_epoch", "val/loss", "epoch"} <= set(scalars)
    # every log_every_n_steps=2 optimizer steps, each the loss of that very step, at Lightning's step:
    # the steps taken before it (global_step - 1)
    steps = [s for s, _ in scalars["train/loss_step"]]
    assert steps == [1, 3, 5]
    for step, value in scalars["train/loss_step"]:
        assert value == pytest.approx(task.steps[step + 1], rel=1e-6)
    # epoch means: batch-size-weighted over 4, 4, 2 (and 3, 3, 1), at the step that ends the epoch
    assert [s for s, _ in scalars["train/loss_epoch"]] == [2, 5]
    for epoch, (_, value) in enumerate(scalars["train/loss_epoch"]):
        assert value == pytest.approx(weighted_mean(task.train_batches[epoch]), rel=1e-6)
    assert [s for s, _ in scalars["val/loss"]] == [2, 5]
    for epoch, (_, value) in enumerate(scalars["val/loss"]):
        assert value == pytest.approx(weighted_mean(task.val_batches[epoch]), rel=1e-6)


def test_hyperparameters_reach_the_hparams_tab_at_the_start_with_lightnings_hp_metric(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    _, trainer = fit_recorder(tmp_path, TensorBoardLogger(str(tmp_path)), epochs=1)
    acc = EventAccumulator(trainer.log_dir)
    acc.Reload()
    content = acc.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    hparams = {k: v.number_value for k, v in start.session_start_info.hparams.items()}
    assert hparams == {"lr": 0.1, "hidden": 8.0}
    exp = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"])
    # written when fit starts (as Lightning): the one metric column is Lightning's hp_metric placeholder
    assert [m.name.tag for m in exp.experiment.metric_infos] == ["hp_metric"]


def test_tensorboards_reader_keeps_the_first_hparams_summary_of_a_run(tmp_path):
    """Why the HParams tab cannot be updated at the end of a run: a later summary (with the final metrics'
    names) in the same run is ignored by TensorBoard's own reader, so the logger writes only the start one."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    logger = TensorBoardLogger(str(tmp_path))
    logger.log_hyperparams({"lr": 0.1})
    logger.log_metrics({"val/loss": 0.5}, 3)
    logger.log_hyperparams({"lr": 0.1}, {"val/loss": 0.5})
    logger.finalize("success")
    acc = EventAccumulator(logger.log_dir)
    acc.Reload()
    exp = plugin_data_pb2.HParamsPluginData.FromString(
        acc.PluginTagToContent("hparams")["_hparams_/experiment"]
    )
    assert [m.name.tag for m in exp.experiment.metric_infos] == ["hp_metric"]


def test_csv_and_tensorboard_agree(tmp_path):
    (tmp_path / "lightning_logs" / "version_4").mkdir(parents=True)
    loggers = [TensorBoardLogger(str(tmp_path)), CSVLogger(str(tmp_path))]
    task, trainer = fit_recorder(tmp_path, loggers, epochs=3)
    assert (
        loggers[0].log_dir == loggers[1].log_dir == os.path.join(str(tmp_path), "lightning_logs", "version_5")
    )
    tb = read_events(loggers[0].log_dir)
    table = read_csv(os.path.join(loggers[1].log_dir, "metrics.csv"))
    assert tb.pop("hp_metric") == [(0, -1.0)]  # Lightning's default_hp_metric placeholder (TensorBoard only)
    assert set(tb) == set(table)
    for tag in tb:  # the CSV holds one row per log call, as Lightning's (so 'epoch' repeats at a step)
        assert dict(tb[tag]) == pytest.approx(dict(table[tag]), rel=1e-6), tag  # event files hold float32
    for epoch in range(3):
        assert table["train/loss_epoch"][epoch][1] == pytest.approx(
            weighted_mean(task.train_batches[epoch]), rel=1e-6
        )
    with open(os.path.join(loggers[1].log_dir, "hparams.yaml")) as f:
        assert yaml.safe_load(f) == {"lr": 0.1, "hidden": 8}


def test_csv_rows_one_per_call_append_and_rewrite_on_new_columns(tmp_path):
    logger = CSVLogger(str(tmp_path), flush_logs_every_n_steps=1)
    logger.log_metrics({"a": 1.0}, step=1)
    logger.log_metrics({"a": 2.0}, step=2)
    logger.log_metrics({"b": 5.0}, step=2)  # same step: its own row, as Lightning's; a new column
    logger.log_metrics({"a": 3.0}, step=3)
    logger.finalize("success")
    with open(logger.metrics_file) as f:
        rows = list(csv.DictReader(f))
    assert rows == [
        {"a": "1.0", "step": "1", "b": ""},
        {"a": "2.0", "step": "2", "b": ""},
        {"a": "", "step": "2", "b": "5.0"},
        {"a": "3.0", "step": "3", "b": ""},
    ]
    again = CSVLogger(str(tmp_path), version=logger.version, flush_logs_every_n_steps=1)  # a resume
    again.log_metrics({"c": 7.0}, step=4)
    again.finalize("success")
    with open(logger.metrics_file) as f:
        assert [r["step"] for r in csv.DictReader(f)] == ["1", "2", "2", "3", "4"]  # nothing lost


def test_versions_count_up_and_default_logger_is_tensorboard_under_logs(tmp_path):
    dirs = []
    for _ in range(2):
        _, trainer = fit_recorder(tmp_path, True, epochs=1)
        dirs.append(trainer.log_dir)
        assert isinstance(trainer.logger, TensorBoardLogger)
    assert dirs == [os.path.join(str(tmp_path), "lightning_logs", f"version_{i}") for i in range(2)]
    assert all(any(f.startswith("events.out.tfevents") for f in os.listdir(d)) for d in dirs)


def test_failed_run_still_flushes_the_csv(tmp_path):
    class Boom(Recorder):
        def training_step(self, batch, batch_idx):
            if self.global_step == 3:
                raise RuntimeError("boom")
            return super().training_step(batch, batch_idx)

    logger = CSVLogger(str(tmp_path))
    trainer = Trainer(max_epochs=3, log_every_n_steps=1, logger=logger, num_sanity_val_steps=0, **QUIET)
    with pytest.raises(RuntimeError, match="boom"):
        trainer.fit(Boom(), DataLoader(data(10), batch_size=4))
    table = read_csv(logger.metrics_file)
    assert [s for s, _ in table["train/loss_step"]] == [0, 1, 2]
    assert all(math.isfinite(v) for _, v in table["train/loss_step"])
