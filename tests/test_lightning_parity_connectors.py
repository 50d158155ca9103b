"""Public behaviour found by Lightning's trainer/connectors and trainer/logging_ tests (issue 43, fourth round): the
loaders' checks, the stage given to setup/teardown, when loggers are finalized, logged Metrics' resets, log_dict of
a MetricCollection, the no-logger warning, TensorBoard's hp_metric, signals; each compared with Lightning itself on
the same script."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import warnings
from typing import Any

import pytest
import torch
from helpers.lightning_pair import pair_trainer as _trainer
from torch.utils.data import DataLoader

pl = pytest.importorskip("pytorch_lightning")
from pytorch_lightning.demos import boring_classes as plb  # noqa: E402

from trainer import demos  # noqa: E402

SHORT = dict(max_epochs=1, limit_train_batches=2, limit_val_batches=0)


def _boring(lightning: bool) -> type:
    return plb.BoringModel if lightning else demos.BoringModel


def _no_loaders(model: Any) -> Any:
    for name in ("train", "val", "test", "predict"):
        setattr(model, f"{name}_dataloader", None)
    return model


def _invalid(lightning: bool, tmp_path: Any) -> list[str]:
    """trainer/connectors/test_data_connector.py::test_non_iterables_raise: the TypeError's words up to the origin."""
    out = []
    for fn in ("validate", "test", "predict"):
        for loader in ([1, object()], object()):
            t = _trainer(lightning, tmp_path, fast_dev_run=1)
            with pytest.raises(TypeError) as passed:
                getattr(t, fn)(_no_loaders(_boring(lightning)()), dataloaders=loader)
            model = _no_loaders(_boring(lightning)())
            setattr(model, f"{'val' if fn == 'validate' else fn}_dataloader", lambda loader=loader: loader)
            with pytest.raises(TypeError) as returned:
                getattr(t, fn)(model)
            out += ["`".join(str(e.value).split("`")[:2]) for e in (passed, returned)]
    return out


def test_a_loader_that_cannot_be_iterated_is_a_type_error_naming_where_it_came_from(tmp_path):
    ours = _invalid(False, tmp_path)
    assert ours == _invalid(True, tmp_path)
    assert ours[:2] == [
        "An invalid dataloader was passed to `Trainer.validate(dataloaders=...)",
        "An invalid dataloader was returned from `BoringModel.val_dataloader()",
    ]


class _InProcess(DataLoader):
    """A DataLoader whose settings say workers, but which reads in this process (no worker starts in the test)."""

    def __iter__(self) -> Any:
        return iter(DataLoader(self.dataset, batch_size=self.batch_size))


def _worker_warnings(lightning: bool, tmp_path: Any, monkeypatch: Any, **loader: Any) -> list[str]:
    """The warnings about a training loader's workers, on a machine of 8 CPUs (suggested: 7 workers)."""
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    reload = loader.pop("reload", 0)
    model = _boring(lightning)()
    data = _InProcess(plb.RandomDataset(32, 8), batch_size=4, **loader)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        _trainer(lightning, tmp_path, reload_dataloaders_every_n_epochs=reload, **SHORT).fit(model, data)
    phrases = (
        "Consider setting `persistent_workers=True`",
        "does not have many workers",
        "reload_dataloaders_every",
    )
    return sorted(f"{w.category.__name__}: {p}" for w in seen for p in phrases if p in str(w.message))


@pytest.mark.parametrize(
    ("loader", "expected"),
    [
        (dict(num_workers=0), ["PossibleUserWarning: does not have many workers"]),
        (dict(num_workers=2), []),
        (
            dict(num_workers=1, multiprocessing_context="spawn"),
            ["UserWarning: Consider setting `persistent_workers=True`"],
        ),
        (
            dict(num_workers=2, persistent_workers=True, pin_memory=True, reload=1),
            ["PossibleUserWarning: reload_dataloaders_every"],
        ),
    ],
    ids=["none", "two", "spawn", "pinned-reloaded"],
)
def test_the_loader_worker_warnings_are_lightnings(tmp_path, monkeypatch, loader, expected):
    ours = _worker_warnings(False, tmp_path, monkeypatch, **dict(loader))
    assert ours == _worker_warnings(True, tmp_path, monkeypatch, **dict(loader)) == expected


def _stages(lightning: bool, tmp_path: Any) -> list[tuple[str, ...]]:
    """What setup/teardown of the task, its DataModule and a callback receive, and when the logger is finalized."""
    seen: list[tuple[str, ...]] = []
    Callback = pl.Callback if lightning else __import__("callbacks").Callback
    Logger = pl.loggers.Logger if lightning else __import__("trainer.loggers", fromlist=["Logger"]).Logger
    DataModule = pl.LightningDataModule if lightning else __import__("trainer").DataModule

    def note(who: str, hook: str, stage: Any) -> None:
        seen.append((who, hook, type(stage).__name__, stage.value, str(stage == stage.value)))

    class Task(_boring(lightning)):  # type: ignore[misc,valid-type]
        def setup(self, stage: Any) -> None:
            note("task", "setup", stage)

        def teardown(self, stage: Any) -> None:
            note("task", "teardown", stage)

    class Data(DataModule):  # type: ignore[misc,valid-type]
        def setup(self, stage: Any) -> None:
            note("dm", "setup", stage)

        def teardown(self, stage: Any) -> None:
            note("dm", "teardown", stage)

        def train_dataloader(self) -> Any:
            return DataLoader(plb.RandomDataset(32, 8), batch_size=4)

        val_dataloader = test_dataloader = predict_dataloader = train_dataloader

    class Cb(Callback):  # type: ignore[misc,valid-type]
        def teardown(self, trainer: Any, module: Any, stage: Any) -> None:
            note("callback", "teardown", stage)
            trainer.logger.log_metrics({stage.value: 1})

        def on_fit_end(self, trainer: Any, module: Any) -> None:
            trainer.logger.log_metrics({"on_fit_end": 1})

    class Buffer(Logger):  # type: ignore[misc,valid-type]
        """trainer/logging_/test_distributed_logging.py's BufferLogger: only what comes before finalize counts."""

        name, version, experiment, save_dir = "buffer", 0, None, None

        def __init__(self) -> None:
            super().__init__()
            self.buffer: dict[str, int] = {}

        def log_metrics(self, metrics: dict[str, Any], step: Any = None) -> None:
            self.buffer.update(metrics)

        def log_hyperparams(self, *args: Any, **kwargs: Any) -> None:
            pass

        def finalize(self, status: str) -> None:
            seen.append(("logger", "finalize", status, *sorted(self.buffer)))
            self.buffer = {}

    t = _trainer(lightning, tmp_path, logger=Buffer(), callbacks=[Cb()], max_epochs=1, limit_train_batches=1,
                 limit_val_batches=1, limit_test_batches=1, limit_predict_batches=1)  # fmt: skip
    model, dm = Task(), Data()
    t.fit(model, datamodule=dm)
    t.validate(model, datamodule=dm, verbose=False)
    t.test(model, datamodule=dm, verbose=False)
    t.predict(model, datamodule=dm)
    return seen


def test_setup_and_teardown_get_a_trainer_fn_and_loggers_finalize_after_teardown_in_every_stage(tmp_path):
    ours = _stages(False, tmp_path)
    assert ours == _stages(True, tmp_path)
    assert ("dm", "setup", "TrainerFn", "fit", "True") in ours
    assert ("logger", "finalize", "success", "predict") in ours  # predict's too, after the teardown hooks


def _metric_resets(lightning: bool, tmp_path: Any) -> list[tuple[str, int]]:
    """trainer/logging_/test_logger_connector.py::test_metrics_reset: a Metric logged with a step value only is
    reset at its epoch's end (besides the reset its forward does)."""
    from torchmetrics import SumMetric

    seen: list[tuple[str, int]] = []

    class Task(_boring(lightning)):  # type: ignore[misc,valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.total, self.resets = SumMetric(), 0
            reset = self.total.reset

            def counted() -> None:
                self.resets += 1
                reset()

            self.total.reset = counted

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            self.total(batch.sum())
            self.resets = 0  # (forward resets too)
            self.log("total", self.total)
            return super().training_step(batch, batch_idx)

        def on_train_epoch_start(self) -> None:
            seen.append(("epoch_start", self.resets))

        def on_train_end(self) -> None:
            seen.append(("train_end", self.resets))

    _trainer(lightning, tmp_path, max_epochs=2, limit_train_batches=2, limit_val_batches=0).fit(Task())
    return seen


def test_a_logged_metric_is_reset_at_the_end_of_its_epoch(tmp_path):
    ours = _metric_resets(False, tmp_path)
    assert ours == _metric_resets(True, tmp_path)
    assert ours[-1] == ("train_end", 1)


def _collection_items(lightning: bool, tmp_path: Any, groups: bool) -> list[tuple[bool, bool]]:
    """test_logger_connector.py::test_metriccollection_compute_groups: the items() arguments of log_dict."""
    from torchmetrics import MetricCollection
    from torchmetrics.classification import MulticlassAccuracy, MulticlassPrecision

    calls: list[tuple[bool, bool]] = []

    class Recorded(MetricCollection):
        logging = False

        def items(self, keep_base: bool = False, copy_state: bool = True) -> Any:
            if self.logging:
                calls.append((keep_base, copy_state))
            return super().items(keep_base=keep_base, copy_state=copy_state)

    class Task(_boring(lightning)):  # type: ignore[misc,valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.metrics = Recorded(
                [
                    MulticlassAccuracy(num_classes=4, average="micro"),
                    MulticlassPrecision(num_classes=4, average="micro"),
                ],
                compute_groups=groups,
            )

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            g = torch.Generator().manual_seed(batch_idx)
            self.metrics(torch.rand(8, 4, generator=g).softmax(-1), torch.randint(0, 4, (8,), generator=g))
            self.metrics.logging = True
            self.log_dict(self.metrics, on_step=True, on_epoch=True)
            self.metrics.logging = False
            return super().training_step(batch, batch_idx)

    t = _trainer(lightning, tmp_path, **SHORT)
    t.fit(Task())
    return calls


@pytest.mark.parametrize("groups", [True, False])
def test_log_dict_of_a_compute_group_collection_copies_no_state_as_lightning(tmp_path, groups):
    ours = _collection_items(False, tmp_path, groups)
    assert ours == _collection_items(True, tmp_path, groups) == [(False, not groups)] * 2


def _no_logger(lightning: bool, tmp_path: Any, logger: bool) -> list[str]:
    """test_logger_connector.py::test_logged_metrics_has_logged_epoch_value: self.log(..., logger=True)."""

    class Task(_boring(lightning)):  # type: ignore[misc,valid-type]
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            self.log("epoch", -batch_idx, logger=True)
            return super().training_step(batch, batch_idx)

    csv = (pl.loggers.CSVLogger if lightning else __import__("trainer.loggers", fromlist=["x"]).CSVLogger)(
        tmp_path
    )
    t = _trainer(lightning, tmp_path, logger=csv if logger else False, **SHORT)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        t.fit(Task())
    assert t.logged_metrics == {"epoch": -1}
    return sorted(
        {type(w.message).__name__ for w in seen if "but have no logger configured" in str(w.message)}
    )


@pytest.mark.parametrize("logger", [False, True])
def test_logging_to_a_logger_without_one_warns_as_lightning(tmp_path, logger):
    ours = _no_logger(False, tmp_path, logger)
    assert ours == _no_logger(True, tmp_path, logger) == ([] if logger else ["UserWarning"])


def _hp_metric_calls(lightning: bool, tmp_path: Any, monkeypatch: Any) -> list[tuple[Any, ...]]:
    """test_eval_loop_logging.py::test_validation_step_log_with_tensorboard: what TensorBoardLogger.log_metrics
    gets (its hp_metric placeholder first, at step None)."""
    cls = (
        pl.loggers.TensorBoardLogger
        if lightning
        else __import__("trainer.loggers", fromlist=["x"]).TensorBoardLogger
    )
    calls: list[tuple[Any, ...]] = []
    monkeypatch.setattr(
        cls, "log_metrics", lambda self, metrics, step=None: calls.append((sorted(metrics), step))
    )

    class Task(_boring(lightning)):  # type: ignore[misc,valid-type]
        def __init__(self, some_val: int = 7) -> None:
            super().__init__()
            self.save_hyperparameters()

        def validation_step(self, batch: Any, batch_idx: int) -> Any:
            self.log("valid_loss_0", self.step(batch), on_step=True, on_epoch=True)

    t = _trainer(lightning, tmp_path, logger=cls(tmp_path / str(lightning)), max_epochs=2, limit_train_batches=1,
                 limit_val_batches=2, log_every_n_steps=1)  # fmt: skip
    t.fit(Task())
    return calls


def test_tensorboard_hp_metric_and_step_values_reach_log_metrics_as_lightnings(tmp_path, monkeypatch):
    ours = _hp_metric_calls(False, tmp_path, monkeypatch)
    assert ours == _hp_metric_calls(True, tmp_path, monkeypatch)
    assert ours[0] == (["hp_metric"], None)


def _sigterm(lightning: bool, tmp_path: Any) -> tuple[Any, ...]:
    """trainer/connectors/test_signal_connector.py::test_sigterm_handler_can_be_added: a SIGTERM handler the script
    installed before fit runs when SIGTERM comes during fit. (What fit raises differs by design: docs/porting.md.)"""
    ran: list[int] = []

    def mine(signum: int, frame: Any) -> None:
        ran.append(signum)

    previous = signal.signal(signal.SIGTERM, mine)

    class Task(_boring(lightning)):  # type: ignore[misc,valid-type]
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            if batch_idx == 0:
                os.kill(os.getpid(), signal.SIGTERM)
            return super().training_step(batch, batch_idx)

    t = _trainer(lightning, tmp_path, **SHORT)
    try:
        with pytest.raises(BaseException) as raised:
            t.fit(Task())
        restored = signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, previous)
    return ran, t.received_sigterm, restored, type(raised.value).__name__


def test_a_sigterm_handler_installed_before_fit_still_runs(tmp_path):
    ran, received, restored, raised = _sigterm(False, tmp_path)
    assert (ran, received, restored) == _sigterm(True, tmp_path)[:3] == ([signal.SIGTERM], True, True)
    assert raised == "SystemExit"  # Lightning: its SIGTERMException (docs/porting.md, deliberate differences)


def _fit_in_a_thread(lightning: bool, tmp_path: Any) -> tuple[Any, ...]:
    """test_signal_connector.py::test_signal_connector_in_thread: a Trainer built and run in another thread."""
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)

    def run() -> int:
        t = _trainer(lightning, tmp_path, **SHORT)
        t.fit(_boring(lightning)())
        return t.global_step

    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        steps = pool.submit(run).result()
    return steps, (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def test_a_trainer_runs_in_another_thread_as_lightnings(tmp_path):
    assert _fit_in_a_thread(False, tmp_path) == _fit_in_a_thread(True, tmp_path) == (2, True)


def _eval_sampler(lightning: bool, tmp_path: Any, custom: bool) -> tuple[Any, ...]:
    """test_data_connector.py::test_replace_distributed_sampler: what an evaluation loader holds under ddp."""
    from torch.utils.data import BatchSampler, DistributedSampler, SequentialSampler

    class Batches(BatchSampler):
        pass

    seen: list[tuple[Any, ...]] = []

    class Task(_boring(lightning)):  # type: ignore[misc,valid-type]
        def test_dataloader(self) -> Any:
            data = plb.RandomDataset(32, 16)
            if custom:
                return DataLoader(
                    data, batch_sampler=Batches(SequentialSampler(data), batch_size=1, drop_last=True)
                )
            return DataLoader(data, batch_size=2, drop_last=True)

        def on_test_start(self) -> None:
            loader = self.trainer.test_dataloaders
            batches = loader.batch_sampler
            seen.append((type(batches).__name__, loader.batch_size, batches.batch_size, batches.drop_last,
                         isinstance(batches.sampler, DistributedSampler)))  # fmt: skip

    _trainer(lightning, tmp_path, strategy="ddp", devices=1, limit_test_batches=2).test(Task(), verbose=False)
    return seen[0]


@pytest.mark.parametrize("custom", [True, False])
def test_an_evaluation_loader_under_ddp_holds_a_distributed_sampler_as_lightnings(tmp_path, custom):
    ours = _eval_sampler(False, tmp_path, custom)
    assert ours == _eval_sampler(True, tmp_path, custom)
    assert ours[-1] is True


def _mock_logger_dir(lightning: bool, tmp_path: Any) -> tuple[Any, ...]:
    """test_distributed_logging.py::test_first_logger_call_in_subprocess: a logger that is not a Logger (a mock):
    nothing called or written before setup, the graph drawn once, checkpoints under <save_dir>/<name>/<version>."""
    from unittest.mock import Mock

    Callback = pl.Callback if lightning else __import__("callbacks").Callback
    root = tmp_path / str(lightning)
    root.mkdir()
    seen: list[Any] = []

    class Observer(Callback):  # type: ignore[misc,valid-type]
        def setup(self, trainer: Any, module: Any, stage: Any) -> None:
            seen.append((len(trainer.logger.method_calls), os.listdir(root)))

        def on_train_start(self, trainer: Any, module: Any) -> None:
            seen.append(trainer.logger.log_graph.call_count)

    logger = Mock()
    logger.version, logger.name, logger.save_dir = "0", "name", str(root)
    t = _trainer(
        lightning, tmp_path, logger=logger, callbacks=[Observer()], enable_checkpointing=True, **SHORT
    )
    t.fit(_boring(lightning)())
    return (
        *seen,
        os.path.relpath(t.checkpoint_callback.dirpath, root),
        sorted(os.listdir(root / "name" / "0")),
    )


def test_checkpoints_of_a_run_whose_logger_is_a_mock_go_where_lightnings_go(tmp_path):
    ours = _mock_logger_dir(False, tmp_path)
    assert ours == _mock_logger_dir(True, tmp_path)
    assert ours[-2] == os.path.join("name", "0", "checkpoints")
