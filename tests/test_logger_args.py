"""Lightning's logger arguments (TensorBoardLogger's log_graph, default_hp_metric, prefix, sub_dir; CSVLogger's
prefix and flush_logs_every_n_steps): what Tandem's loggers write equals what Lightning 2.6's own write for the
same calls, read back with TensorBoard's reader and the csv module."""

from __future__ import annotations

import csv
import os
import warnings

import pytest
import torch

from trainer import Task, Trainer
from trainer.loggers import CSVLogger, TensorBoardLogger

pl_loggers = pytest.importorskip("pytorch_lightning.loggers")
CALLS = [
    ({"loss": 0.5, "acc": 0.25}, 0),
    ({"loss": 0.4}, 1),
    ({"loss": 0.3, "acc": 0.5}, 2),
    ({"loss": 0.2}, 3),
]


def scalars(log_dir: str) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(log_dir, size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def rows(path: str) -> list[dict[str, str]]:
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_tensorboard_prefix_sub_dir_and_hp_metric_as_lightnings(tmp_path):
    kw = dict(name="exp", version=3, prefix="run", sub_dir="fold0")
    ours = TensorBoardLogger(str(tmp_path / "ours"), **kw)
    theirs = pl_loggers.TensorBoardLogger(str(tmp_path / "theirs"), **kw)
    assert os.path.relpath(ours.log_dir, tmp_path / "ours") == os.path.relpath(
        theirs.log_dir, tmp_path / "theirs"
    )
    assert ours.log_dir.endswith(os.path.join("exp", "version_3", "fold0"))
    ours.log_hyperparams({"lr": 0.1})  # at the start, as both Trainers call it
    theirs.log_hyperparams({"lr": 0.1})
    for metrics, step in CALLS:
        ours.log_metrics(metrics, step)
        theirs.log_metrics(metrics, step)
    ours.finalize("success")
    theirs.finalize("success")
    a, b = scalars(ours.log_dir), scalars(theirs.log_dir)
    assert set(a) == set(b) == {"run-loss", "run-acc", "run-hp_metric"}
    assert a == b


def test_tensorboard_writes_hparams_yaml_as_lightnings(tmp_path):
    """Lightning's TensorBoardLogger writes <log_dir>/hparams.yaml at its first save after the hyperparameters
    (the Trainer saves right after logging them at the stage start), and keeps an existing one."""
    import yaml

    params = {"lr": 0.1, "net": {"hidden": [8, 4], "act": "relu"}, "name": "x"}
    paths = []
    for i, cls in enumerate((TensorBoardLogger, pl_loggers.TensorBoardLogger)):
        logger = cls(str(tmp_path / str(i)), name="exp", version=0, sub_dir="fold0")
        logger.log_hyperparams(params)
        logger.save()
        logger.log_hyperparams({"lr": 0.2})  # a later stage's: the file of the first stays
        logger.save()
        logger.finalize("success")
        paths.append(os.path.join(logger.log_dir, "hparams.yaml"))
    ours, theirs = (yaml.safe_load(open(p)) for p in paths)
    assert ours == theirs == params


def test_default_hp_metric_off_writes_no_placeholder(tmp_path):
    ours = TensorBoardLogger(str(tmp_path), default_hp_metric=False)
    ours.log_metrics({"loss": 1.0}, 0)
    ours.log_hyperparams({"lr": 0.1}, {"loss": 1.0})
    ours.finalize("success")
    assert set(scalars(ours.log_dir)) == {"loss"}


@pytest.mark.parametrize("every", [1, 2, 3])
def test_csv_prefix_and_flush_cadence_as_lightnings(tmp_path, every):
    ours = CSVLogger(str(tmp_path / "ours"), prefix="p", flush_logs_every_n_steps=every)
    theirs = pl_loggers.CSVLogger(str(tmp_path / "theirs"), prefix="p", flush_logs_every_n_steps=every)
    for metrics, step in CALLS:
        ours.log_metrics(metrics, step)
        theirs.log_metrics(metrics, step)
        # the rows on disk after each call: the same number, so the same flush moments
        assert len(rows(ours.metrics_file)) == len(rows(os.path.join(theirs.log_dir, "metrics.csv"))), step
    ours.finalize("success")
    theirs.finalize("success")
    a, b = rows(ours.metrics_file), rows(os.path.join(theirs.log_dir, "metrics.csv"))
    assert a == b and set(a[0]) == {"p-loss", "p-acc", "step"}


class Graphed(Task):
    def __init__(self, example: bool = True) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
        if example:
            self.example_input_array = torch.zeros(2, 4)

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        return self(batch[0]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit(tmp_path, task, logger, **kw):
    data = torch.utils.data.TensorDataset(torch.randn(8, 4))
    Trainer(max_epochs=1, logger=logger, default_root_dir=str(tmp_path), enable_progress_bar=False,
            enable_model_summary=False, enable_checkpointing=False, **kw).fit(task, torch.utils.data.DataLoader(data, batch_size=4))  # fmt: skip


def test_log_graph_draws_the_task_on_its_example_input(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logger = TensorBoardLogger(str(tmp_path), log_graph=True)
    _fit(tmp_path, Graphed(), logger)
    acc = EventAccumulator(logger.log_dir)
    acc.Reload()
    graph = acc.Graph()
    assert any("Linear" in node.op or "linear" in node.name.lower() for node in graph.node)
    off = TensorBoardLogger(str(tmp_path), name="off")  # log_graph=False: Lightning's default, no graph
    _fit(tmp_path, Graphed(), off)
    acc = EventAccumulator(off.log_dir)
    acc.Reload()
    assert not acc.Tags()["graph"]


def test_log_graph_without_an_example_warns_as_lightning(tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _fit(tmp_path, Graphed(example=False), TensorBoardLogger(str(tmp_path), log_graph=True))
    assert any("could not log the graph" in str(w.message) for w in caught)


class WithHparams(Graphed):
    def __init__(self, lr: float = 0.1) -> None:
        super().__init__()
        self.save_hyperparameters()


@pytest.mark.parametrize("autolog", [True, False])
def test_enable_autolog_hparams(tmp_path, autolog):
    logger = CSVLogger(str(tmp_path))
    _fit(tmp_path, WithHparams(), logger, enable_autolog_hparams=autolog)
    assert os.path.exists(os.path.join(logger.log_dir, "hparams.yaml")) == autolog


def test_log_every_n_steps_0_logs_no_step_metrics_as_lightning(tmp_path):
    class Logs(Graphed):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            self.log("loss", loss, on_step=True, on_epoch=True)
            return loss

    logger = CSVLogger(str(tmp_path))
    _fit(tmp_path, Logs(), logger, log_every_n_steps=0)
    table = rows(logger.metrics_file)
    assert [r.get("loss_epoch") for r in table if r.get("loss_epoch")] and not any(
        r.get("loss_step") for r in table
    )


def test_tensorboard_writes_a_steps_scalars_as_one_event(tmp_path):
    """The writer's cost is per event: a step with several metrics is one event holding them all, and
    TensorBoard's own reader sees each tag at its steps with its values (as Lightning's one per scalar)."""
    import glob
    import struct

    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    logger = TensorBoardLogger(str(tmp_path), name="exp", version=0)
    for metrics, step in CALLS:
        logger.log_metrics(metrics, step)
    logger.finalize("success")
    (path,) = glob.glob(os.path.join(logger.log_dir, "events.out.tfevents.*"))
    events = [e for e in EventFileLoader(path).Load() if e.HasField("summary")]
    assert [(e.step, sorted(v.tag for v in e.summary.value)) for e in events] == [
        (step, sorted(metrics)) for metrics, step in CALLS
    ]
    f32 = lambda x: struct.unpack("f", struct.pack("f", x))[0]  # noqa: E731  # a scalar event's precision
    assert scalars(logger.log_dir) == {
        "loss": [(step, f32(m["loss"])) for m, step in CALLS],
        "acc": [(step, f32(m["acc"])) for m, step in CALLS if "acc" in m],
    }


def test_tensorboard_writes_in_the_training_thread_and_each_event_reaches_the_file_at_once(tmp_path):
    """No writer thread (tensorboard's opened the file per record and took the GIL from the training thread
    for each system call); an event is on disk as soon as it is logged, before any flush, so a killed run
    keeps it; `experiment` is still torch's SummaryWriter (add_text lands in the same file)."""
    import glob
    import threading

    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from torch.utils.tensorboard import SummaryWriter

    before = set(threading.enumerate())
    logger = TensorBoardLogger(str(tmp_path), name="exp", version=0)
    assert isinstance(logger.experiment, SummaryWriter)
    logger.log_metrics({"loss": 0.5}, 3)
    logger.experiment.add_text("note", "hello", 4)
    assert set(threading.enumerate()) == before  # no thread started
    (path,) = glob.glob(os.path.join(logger.log_dir, "events.out.tfevents.*"))
    events = list(EventFileLoader(path).Load())  # read while the writer is open and unflushed
    assert events[0].file_version == "brain.Event:2"
    assert [(e.step, [v.tag for v in e.summary.value]) for e in events[1:]] == [
        (3, ["loss"]),
        (4, ["note/text_summary"]),
    ]
    logger.finalize("success")


def test_event_files_opened_in_the_same_second_never_share_a_name(tmp_path, monkeypatch):
    """Two writers in one directory within one second (two loggers, or a resume) each get a new file; an
    existing file of that name, another process's, is never truncated."""
    import time as time_module

    from trainer.loggers import event_file

    monkeypatch.setattr(time_module, "time", lambda: 1_700_000_000.0)
    first = event_file.EventFile(str(tmp_path))
    stem, number = first.path.rsplit(".s", 1)
    taken = f"{stem}.s{int(number) + 1}"  # the name the next file would take
    with open(taken, "wb") as f:
        f.write(b"another run's events")
    second = event_file.EventFile(str(tmp_path))
    assert len({first.path, second.path, taken}) == 3
    assert second.path == f"{stem}.s{int(number) + 2}"  # the taken name was skipped
    with open(taken, "rb") as f:
        assert f.read() == b"another run's events"
    first.close()
    second.close()
