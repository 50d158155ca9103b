"""Callbacks: ModelCheckpoint, EarlyStopping, LearningRateMonitor, Timer, ProgressBar, ModelSummary, defaults,
and the promise that a step which writes nothing synchronizes nothing."""

from __future__ import annotations

import csv
import math
import os
import time
from datetime import timedelta

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from callbacks import (
    Callback,
    EarlyStopping,
    LearningRateMonitor,
    ModelCheckpoint,
    ModelSummary,
    ProgressBar,
    Timer,
)
from callbacks.timer import parse_duration
from strategies.single import SingleDeviceStrategy
from trainer import Task, Trainer
from trainer.errors import ConfigError
from trainer.loggers import CSVLogger

QUIET = dict(logger=False, enable_progress_bar=False, enable_model_summary=False)


def loader(n: int = 8, batch_size: int = 4, seed: int = 0) -> DataLoader:
    g = torch.Generator().manual_seed(seed)
    return DataLoader(TensorDataset(torch.randn(n, 2, generator=g)), batch_size=batch_size)


class Scored(Task):
    """Two steps per epoch; validation logs a score chosen by the test for each epoch."""

    def __init__(self, scores: list[float] | None = None, lr: float = 0.1) -> None:
        super().__init__()
        self.scores = scores or [0.0] * 100
        self.lr = lr
        self.net = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        loss = self.net(batch[0]).pow(2).mean()
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val/score", float(self.scores[self.current_epoch]), prog_bar=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def fit(
    task: Task,
    callbacks: list[Callback],
    epochs: int,
    val: bool = True,
    ckpt_path: str | None = None,
    **kwargs,
) -> Trainer:
    options = {**QUIET, "num_sanity_val_steps": 0, **kwargs}
    trainer = Trainer(max_epochs=epochs, callbacks=callbacks, **options)
    trainer.fit(task, loader(), loader(2, 2) if val else None, ckpt_path=ckpt_path)
    return trainer


# ----- ModelCheckpoint ---------------------------------------------------------------------------------
SCORES = [5.0, 3.0, 8.0, 1.0, 7.0, 2.0]


class CountFiles(Callback):
    def __init__(self, dirpath):
        self.dirpath, self.most = dirpath, 0

    def on_train_epoch_end(self, trainer, task):
        if os.path.isdir(self.dirpath):
            self.most = max(self.most, len(os.listdir(self.dirpath)))


@pytest.mark.parametrize(
    ("mode", "kept", "best"), [("min", {3: 1.0, 5: 2.0}, 3), ("max", {2: 8.0, 4: 7.0}, 2)]
)
def test_keeps_exactly_the_top_k_by_the_monitored_value(tmp_path, mode, kept, best):
    d = str(tmp_path / "ckpt")
    cb = ModelCheckpoint(
        dirpath=d, filename="{epoch}-{val/score:.1f}", monitor="val/score", mode=mode, save_top_k=2
    )
    counter = CountFiles(d)
    fit(Scored(SCORES), [cb, counter], epochs=6)
    names = {e: f"epoch={e}-val_score={s:.1f}.ckpt" for e, s in kept.items()}
    assert sorted(os.listdir(d)) == sorted(names.values())
    assert counter.most <= 2
    assert cb.best_model_path == os.path.join(d, names[best])
    assert cb.best_model_score.item() == kept[best]
    assert {os.path.basename(p): v for p, v in cb.best_k_models.items()} == {
        names[e]: s for e, s in kept.items()
    }
    ckpt = torch.load(cb.best_model_path, weights_only=False)
    assert ckpt["epoch"] == best
    assert ckpt["callbacks"][cb.state_key]["best_model_score"] == kept[best]  # the state includes this save


def test_resume_restores_the_best_score_and_top_k(tmp_path):
    scores = [5.0, 3.0, 8.0, 1.0, 7.0, 2.0, 9.0, 0.5]

    def make(d):
        return ModelCheckpoint(dirpath=d, monitor="val/score", save_top_k=2, save_last=True)

    whole = make(str(tmp_path / "whole"))
    fit(Scored(scores), [whole], epochs=8)
    first, second = make(str(tmp_path / "split")), make(str(tmp_path / "split"))
    fit(Scored(scores), [first], epochs=4)
    assert first.best_model_score.item() == 1.0

    class Probe(Callback):
        def on_train_start(self, trainer, task):
            self.restored = (second.best_model_score.item(), dict(second.best_k_models))

    probe = Probe()
    fit(Scored(scores), [second, probe], epochs=8, ckpt_path="last")
    assert probe.restored == (1.0, first.best_k_models)
    assert second.best_model_score.item() == whole.best_model_score.item() == 0.5
    assert sorted(os.listdir(tmp_path / "split")) == sorted(os.listdir(tmp_path / "whole"))
    assert {os.path.basename(p): v for p, v in second.best_k_models.items()} == {
        os.path.basename(p): v for p, v in whole.best_k_models.items()
    }


def test_resume_into_a_new_version_directory_carries_the_best(tmp_path):
    scores = [5.0, 1.0, 8.0, 7.0, 9.0, 6.0]
    root = str(tmp_path)
    first = ModelCheckpoint(monitor="val/score", save_last=True)
    fit(Scored(scores), [first], epochs=3, logger=True, default_root_dir=root)
    assert os.path.dirname(first.best_model_path) == os.path.join(root, "logs", "version_0", "checkpoints")
    second = ModelCheckpoint(monitor="val/score", save_last=True)
    trainer = fit(Scored(scores), [second], epochs=6, logger=True, default_root_dir=root, ckpt_path="last")
    assert second.dirpath == os.path.join(trainer.log_dir, "checkpoints")
    assert trainer.log_dir.endswith("version_1")
    assert second.best_model_score.item() == 1.0  # later epochs were worse: the best stays in version_0
    assert second.best_model_path == first.best_model_path
    assert os.path.isfile(first.best_model_path)


def test_monitored_key_never_logged_raises_naming_the_logged_keys(tmp_path):
    cb = ModelCheckpoint(dirpath=str(tmp_path), monitor="val/acc")
    with pytest.raises(ConfigError, match=r"'val/acc'.*logged keys: \[.*'val/score'"):
        fit(Scored(), [cb], epochs=1)


def test_unknown_key_in_filename_template_raises_naming_the_logged_keys(tmp_path):
    cb = ModelCheckpoint(dirpath=str(tmp_path), filename="{epoch}-{val/scor:.2f}")
    with pytest.raises(ConfigError, match=r"val/scor.*logged keys: \[.*'val/score'"):
        fit(Scored(), [cb], epochs=1)
    with pytest.raises(ConfigError, match="bad format"):
        ModelCheckpoint(filename="{val/score:.2q}")


def test_validation_key_before_the_first_validation_waits_instead_of_failing(tmp_path):
    cb = ModelCheckpoint(dirpath=str(tmp_path), monitor="val/score", every_n_train_steps=1, save_top_k=-1)
    with pytest.warns(UserWarning, match="Skipping this save until validation has run"):
        fit(Scored([3.0, 2.0]), [cb], epochs=2)
    assert sorted(os.listdir(tmp_path)) == ["epoch=1-step=3.ckpt", "epoch=1-step=4.ckpt"]


@pytest.mark.parametrize(
    ("kwargs", "epochs", "expected"),
    [
        ({}, 3, ["epoch=2-step=6.ckpt"]),
        ({"save_top_k": -1}, 3, ["epoch=0-step=2.ckpt", "epoch=1-step=4.ckpt", "epoch=2-step=6.ckpt"]),
        ({"save_top_k": -1, "every_n_train_steps": 3}, 3, ["epoch=1-step=3.ckpt", "epoch=2-step=6.ckpt"]),
        ({"save_top_k": -1, "every_n_epochs": 2}, 4, ["epoch=1-step=4.ckpt", "epoch=3-step=8.ckpt"]),
        ({"save_last": True, "save_top_k": 0}, 2, ["last.ckpt"]),
    ],
)
def test_triggers_without_a_monitor(tmp_path, kwargs, epochs, expected):
    cb = ModelCheckpoint(dirpath=str(tmp_path), **kwargs)
    fit(Scored(), [cb], epochs=epochs, val=False)
    assert sorted(os.listdir(tmp_path)) == expected


def test_writes_go_through_atomic_save_and_leave_no_temporary_files(tmp_path, monkeypatch):
    import trainer.checkpoint_io as ckpt_io  # where CheckpointIO.write finds it

    written = []
    real = ckpt_io.atomic_save
    monkeypatch.setattr(
        ckpt_io, "atomic_save", lambda obj, path: (written.append(os.fspath(path)), real(obj, path))
    )
    cb = ModelCheckpoint(dirpath=str(tmp_path), monitor="val/score", save_top_k=2, save_last=True)
    fit(Scored(SCORES), [cb], epochs=6)
    assert set(os.listdir(tmp_path)) <= {os.path.basename(p) for p in written}
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".tmp")]
    assert cb.last_checkpoint_path() == os.path.join(str(tmp_path), "last.ckpt")


def test_default_dirpath_follows_the_logger_or_the_root_dir(tmp_path):
    with_logger = fit(Scored(), [], epochs=1, logger=True, default_root_dir=str(tmp_path / "a"))
    cb = with_logger.checkpoint_callback
    assert cb.dirpath == os.path.join(with_logger.log_dir, "checkpoints")
    assert os.listdir(cb.dirpath) == ["epoch=0-step=2.ckpt"]
    without = fit(Scored(), [], epochs=1, default_root_dir=str(tmp_path / "b"))
    assert without.checkpoint_callback.dirpath == os.path.join(str(tmp_path / "b"), "checkpoints")


def test_max_steps_mid_epoch_still_refreshes_last(tmp_path):
    cb = ModelCheckpoint(dirpath=str(tmp_path), save_last=True)
    fit(Scored(), [cb], epochs=5, val=False, max_steps=3)
    assert torch.load(os.path.join(str(tmp_path), "last.ckpt"), weights_only=False)["global_step"] == 3


# ----- EarlyStopping -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("scores", "kwargs", "stopped"),
    [
        ([5, 4, 4.5, 4.2, 3, 2, 1, 0], {"patience": 2}, 3),
        ([5, 4.8, 4.75, 4.4, 4.2, 4, 3.8, 3.6], {"patience": 2, "min_delta": 0.3}, 2),
        ([5, 4, 3, 2, 1, 0, -1, -2], {"stopping_threshold": 3}, 3),
        ([5, 4, 12, 2, 1, 0, -1, -2], {"divergence_threshold": 10}, 2),
        ([5, 4, math.nan, 2, 1, 0, -1, -2], {}, 2),
        ([1, 2, 3, 4, 5, 6, 7, 8], {"mode": "max", "patience": 1}, None),
        ([1, 2, 2, 4, 5, 6, 7, 8], {"mode": "max", "patience": 1}, 2),
    ],
)
def test_early_stopping_criteria(scores, kwargs, stopped):
    es = EarlyStopping("val/score", **kwargs)
    trainer = fit(Scored(scores), [es], epochs=8, enable_checkpointing=False)
    if stopped is None:
        assert trainer.current_epoch == 8 and es.stopping_reason is None
    else:
        assert (es.stopped_epoch, trainer.current_epoch) == (stopped, stopped + 1)
        assert es.stopping_reason


def test_early_stopping_missing_key_raises_or_warns():
    with pytest.raises(ConfigError, match=r"'val/loss'.*logged keys: \[.*'val/score'"):
        fit(Scored(), [EarlyStopping("val/loss")], epochs=2, enable_checkpointing=False)
    with pytest.warns(UserWarning, match="val/loss"):
        trainer = fit(
            Scored(), [EarlyStopping("val/loss", strict=False)], epochs=2, enable_checkpointing=False
        )
    assert trainer.current_epoch == 2


class OtherRankVotesStop(SingleDeviceStrategy):
    """As if another rank's EarlyStopping wanted to stop: a 'max' reduction of the flag gives 1."""

    def reduce(self, tensor, op="mean"):
        return torch.ones_like(tensor) if op == "max" else tensor


def test_early_stopping_decision_is_reduced_across_ranks():
    es = EarlyStopping("val/score", patience=5)
    trainer = Trainer(
        strategy=OtherRankVotesStop(accelerator="cpu"),
        max_epochs=5,
        callbacks=[es],
        enable_checkpointing=False,
        num_sanity_val_steps=0,
        **QUIET,
    )
    trainer.fit(Scored([5, 4, 3, 2, 1]), loader(), loader(2, 2))
    assert trainer.current_epoch == 1 and es.stopping_reason == "another rank asked to stop"


def test_early_stopping_state_goes_into_the_checkpoint(tmp_path):
    es = EarlyStopping("val/score", patience=3)
    cb = ModelCheckpoint(dirpath=str(tmp_path), save_last=True)
    fit(Scored([5, 6, 7, 8]), [cb, es], epochs=3)
    state = torch.load(cb.last_model_path, weights_only=False)["callbacks"][es.state_key]
    assert state == {"wait_count": 2, "stopped_epoch": 0, "best_score": 5.0, "patience": 3}
    again = EarlyStopping("val/score", patience=3)
    trainer = fit(
        Scored([5, 6, 7, 8, 9, 10]),
        [ModelCheckpoint(dirpath=str(tmp_path)), again],
        epochs=6,
        ckpt_path=cb.last_model_path,
    )
    assert again.stopped_epoch == 3 and trainer.current_epoch == 4  # the third check without improvement


def _ddp_run(rank: int, world_size: int, root: str) -> dict[str, object]:
    from test_metrics import SyncTask, data

    from strategies.ddp import DDPStrategy

    # 1. validate: torchmetrics syncs itself, sync_dist=True reduces the logged mean (12 samples per rank)
    trainer = Trainer(strategy=DDPStrategy(accelerator="cpu", devices=world_size), **QUIET)
    (metrics,) = trainer.validate(SyncTask(), DataLoader(data(24, seed=2), batch_size=5))
    # 2. fit: rank 1 stops improving after epoch 0, rank 0 keeps improving: both must stop at epoch 1
    scores = [5.0, 4.0, 3.0, 2.0, 1.0, 0.0] if rank == 0 else [5.0, 6.0, 7.0, 8.0, 9.0, 10.0]
    es = EarlyStopping("val/score", patience=1)
    ck = ModelCheckpoint(dirpath=root, monitor="val/score", save_top_k=1)
    trainer = Trainer(
        strategy=DDPStrategy(accelerator="cpu", devices=world_size),
        max_epochs=6,
        callbacks=[es, ck],
        num_sanity_val_steps=0,
        **QUIET,
    )
    trainer.fit(Scored(scores), loader(), loader(4, 2))
    return {
        "epoch": trainer.current_epoch,
        "step": trainer.global_step,
        "best": ck.best_model_path,
        "score": ck.best_model_score.item(),
        "metrics": metrics,
    }


def test_ddp_metrics_sync_ranks_stop_together_and_agree_on_the_best_checkpoint(dist_run, tmp_path):
    """One 2-process run (spawning is the slow part) for every cross-rank promise of logging and callbacks."""
    pytest.importorskip("strategies.ddp")
    from test_metrics import SyncTask, data

    (single,) = Trainer(**QUIET).validate(SyncTask(), DataLoader(data(24, seed=2), batch_size=5))
    r0, r1 = dist_run(_ddp_run, str(tmp_path))
    for r in (r0, r1):  # torchmetrics accuracy and the sync_dist mean equal the single-process values
        assert r["metrics"]["val/acc"] == pytest.approx(single["val/acc"], abs=1e-6)
        assert r["metrics"]["val/loss"] == pytest.approx(single["val/loss"], abs=1e-5)
    assert r0 == r1
    assert r0["epoch"] == 2 and r0["score"] == 4.0  # rank 0's metric decides which file is best
    assert os.listdir(tmp_path) == [os.path.basename(r0["best"])]


# ----- LearningRateMonitor -------------------------------------------------------------------------------
class Scheduled(Scored):
    def __init__(self, interval: str = "epoch", groups: int = 1) -> None:
        super().__init__()
        self.interval, self.groups = interval, groups
        self.other = torch.nn.Linear(2, 1)

    def configure_optimizers(self):
        params = [{"params": self.net.parameters()}]
        if self.groups == 2:
            params.append({"params": self.other.parameters(), "lr": 1.0})
        opt = torch.optim.SGD(params, lr=0.1, momentum=0.9)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": self.interval}}


def csv_columns(logger: CSVLogger) -> dict[str, list[tuple[int, float]]]:
    out: dict[str, list[tuple[int, float]]] = {}
    with open(logger.metrics_file) as f:
        for row in csv.DictReader(f):
            for k, v in row.items():
                if k != "step" and v:
                    out.setdefault(k, []).append((int(row["step"]), float(v)))
    return out


def test_lr_monitor_per_epoch_and_per_step(tmp_path):
    logger = CSVLogger(str(tmp_path), name="epoch")
    monitor = LearningRateMonitor(log_momentum=True)
    fit(Scheduled("epoch"), [monitor], epochs=3, val=False, logger=logger, enable_checkpointing=False)
    cols = csv_columns(logger)
    assert cols["lr-SGD"] == [(0, 0.1), (2, 0.05), (4, 0.025)]
    assert cols["lr-SGD-momentum"] == [(0, 0.9), (2, 0.9), (4, 0.9)]

    logger = CSVLogger(str(tmp_path), name="step")
    monitor = LearningRateMonitor(logging_interval="step")
    fit(
        Scheduled("step", groups=2),
        [monitor],
        epochs=2,
        val=False,
        logger=logger,
        log_every_n_steps=2,
        enable_checkpointing=False,
    )
    cols = csv_columns(logger)  # written before steps 2 and 4, with the rate those steps use
    assert cols["lr-SGD/pg1"] == [(1, 0.05), (3, 0.0125)]
    assert cols["lr-SGD/pg2"] == [(1, 0.5), (3, 0.125)]


def test_lr_monitor_needs_a_logger():
    with pytest.raises(ConfigError, match="no"):
        fit(Scheduled(), [LearningRateMonitor()], epochs=1, val=False, enable_checkpointing=False)


# ----- Timer ----------------------------------------------------------------------------------------
class Slow(Scored):
    def training_step(self, batch, batch_idx):
        time.sleep(0.02)
        return super().training_step(batch, batch_idx)


def test_max_time_stops_training_and_timer_state_round_trips():
    trainer = fit(Slow(), [], epochs=1000, val=False, enable_checkpointing=False, max_time={"seconds": 0.3})
    timer = next(cb for cb in trainer.callbacks if isinstance(cb, Timer))
    assert 1 <= trainer.global_step < 30
    assert timer.time_elapsed() >= 0.3
    resumed = Timer(duration=timedelta(seconds=10))
    resumed.load_state_dict(timer.state_dict())
    assert resumed.time_elapsed() == pytest.approx(timer.time_elapsed("train"), abs=1e-6)
    assert resumed.time_remaining() == pytest.approx(10 - timer.time_elapsed("train"), abs=1e-6)


def test_timer_durations():
    assert parse_duration("01:02:03:04") == timedelta(days=1, hours=2, minutes=3, seconds=4)
    assert parse_duration({"minutes": 5}) == timedelta(minutes=5)
    assert parse_duration(1.5) == timedelta(seconds=1.5)
    with pytest.raises(ConfigError, match="DD:HH:MM:SS"):
        parse_duration("2 hours")


# ----- ProgressBar, ModelSummary, defaults ---------------------------------------------------------------
def test_progress_bar_and_summary_print_on_rank_zero(tmp_path, capsys):
    Trainer(max_epochs=2, default_root_dir=str(tmp_path), logger=False).fit(Scored(), loader(), loader(2, 2))
    out = capsys.readouterr().out
    assert "Epoch 0" in out and "Epoch 1" in out and "train/loss=" in out and "val/score=0" in out
    assert "Sanity Checking" in out and "Validation" in out
    assert "Total params" in out and "| net  | Linear | 3" in out


class RankOne(SingleDeviceStrategy):
    @property
    def global_rank(self) -> int:
        return 1


def test_other_ranks_write_no_files_and_print_nothing(tmp_path, capsys):
    es = EarlyStopping("val/score")
    callbacks = [ModelCheckpoint(monitor="val/score", save_last=True), es, LearningRateMonitor()]
    trainer = Trainer(
        strategy=RankOne(accelerator="cpu"),
        max_epochs=2,
        default_root_dir=str(tmp_path),
        callbacks=callbacks,
        logger=[CSVLogger(str(tmp_path))],
    )
    trainer.fit(Scored(), loader(), loader(2, 2))
    assert os.listdir(tmp_path) == []
    assert capsys.readouterr().out == ""


def test_defaults_follow_the_enable_flags_and_put_checkpointing_last():
    es = EarlyStopping("val/score")
    kinds = [type(cb) for cb in Trainer(callbacks=[ModelCheckpoint(), es]).callbacks]
    assert kinds == [EarlyStopping, ProgressBar, ModelSummary, ModelCheckpoint]
    assert (
        Trainer(enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False).callbacks
        == []
    )
    with pytest.raises(ConfigError, match="enable_checkpointing=False"):
        Trainer(enable_checkpointing=False, callbacks=[ModelCheckpoint()])
    with pytest.raises(ConfigError, match="enable_progress_bar=False"):
        Trainer(enable_progress_bar=False, callbacks=ProgressBar())
    with pytest.raises(ConfigError, match="mutually exclusive"):
        ModelCheckpoint(every_n_epochs=2, every_n_train_steps=5)
    with pytest.raises(ConfigError, match="needs monitor"):
        ModelCheckpoint(save_top_k=3)


def test_fast_dev_run_writes_no_checkpoint(tmp_path):
    cb = ModelCheckpoint(dirpath=str(tmp_path / "ck"), save_last=True)
    Trainer(fast_dev_run=True, callbacks=[cb], enable_progress_bar=False).fit(
        Scored(), loader(), loader(2, 2)
    )
    assert not os.path.exists(tmp_path / "ck")


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
        callbacks=[probe, ProgressBar(refresh_rate=4, min_interval_s=0.0)],
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
    )  # defaults: TensorBoard, ProgressBar(refresh_rate=1), checkpointing
    start = time.monotonic()
    trainer.fit(Logs(), loader(n=200, batch_size=1))
    elapsed = time.monotonic() - start
    syncing = [i for i, n in enumerate(probe.per_batch()) if n]
    logging = [i for i in syncing if (i + 1) % 50 == 0]
    assert len(logging) == 3
    assert len(syncing) - len(logging) <= elapsed / 0.1 + 2


@pytest.mark.parametrize("bad", [8.64e13, float("nan"), float("inf"), -5, 0, {"hourz": 1}, "1:2"])
def test_unusable_max_time_is_a_config_error(bad):
    from trainer.errors import ConfigError

    with pytest.raises(ConfigError, match="Timer duration"):
        Trainer(max_time=bad, logger=False)
