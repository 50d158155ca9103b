"""Progress bars, summaries, LR monitor and loggers compared with Lightning's on the same small runs (issue 36)."""

from __future__ import annotations

import sys
from unittest import mock

import pytest

pl = pytest.importorskip("pytorch_lightning")

import pytorch_lightning.callbacks.progress.tqdm_progress as pl_tqdm_module  # noqa: E402
from pytorch_lightning.demos.boring_classes import BoringModel as PLBoring  # noqa: E402

import callbacks.progress.tqdm_bar as tqdm_module  # noqa: E402
from callbacks import TQDMProgressBar  # noqa: E402
from callbacks.progress.tqdm_bar import Tqdm  # noqa: E402
from trainer import Trainer  # noqa: E402
from trainer.demos import BoringModel  # noqa: E402


def recording(base: type) -> type:
    """A bar class that records every count, total and description it is given (Lightning's MockTqdm idea)."""

    class Recording(base):
        def __init__(self, *args, **kwargs):
            self.counts, self.totals, self.descs = [], [], []
            super().__init__(*args, **kwargs)
            self.counts, self.totals, self.descs = [], [], []

        def __setattr__(self, name, value):
            if name == "n" and hasattr(self, "counts") and (not self.counts or self.counts[-1] != value):
                self.counts.append(value)
            if name == "total" and hasattr(self, "totals"):
                self.totals.append(value)
            super().__setattr__(name, value)

        def set_description(self, *args, **kwargs):
            super().set_description(*args, **kwargs)
            self.descs.append(self.desc)

    return Recording


def _bars(bar) -> dict:
    out = {}
    for kind in ("train", "val", "test", "predict"):
        try:
            b = getattr(bar, f"{kind}_progress_bar")
        except TypeError:
            continue
        out[kind] = (b.counts, b.totals, b.descs, b.leave)
    return out


def _run(lightning: bool, tmp_path, refresh_rate: int, **limits) -> dict:
    module, Bar, Model, T = (
        (pl_tqdm_module, pl.callbacks.TQDMProgressBar, PLBoring, pl.Trainer)
        if lightning
        else (tqdm_module, TQDMProgressBar, BoringModel, Trainer)
    )
    bar = Bar(refresh_rate=refresh_rate)
    t = T(default_root_dir=str(tmp_path), max_epochs=1, callbacks=[bar], logger=False,
          enable_checkpointing=False, enable_model_summary=False, **limits)  # fmt: skip
    with mock.patch.object(module, "Tqdm", recording(module.Tqdm)):
        t.fit(Model())
        after_fit = _bars(bar)
        t.test(Model(), verbose=False)
        t.predict(Model())
    return {"fit": after_fit, "all": _bars(bar)}


@pytest.mark.parametrize(
    ("refresh_rate", "limits"),
    [(1, {"limit_train_batches": 2, "limit_val_batches": 3}), (3, {"limit_train_batches": 5,
     "limit_val_batches": 2, "limit_test_batches": 5, "limit_predict_batches": 1, "num_sanity_val_steps": 1})],
)  # fmt: skip
def test_tqdm_bars_count_total_and_describe_as_lightnings(tmp_path, refresh_rate, limits):
    ours = _run(False, tmp_path / "t", refresh_rate, **limits)
    theirs = _run(True, tmp_path / "l", refresh_rate, **limits)
    assert ours == theirs
    assert ours["all"]["val"][2] == ["Validation DataLoader 0: "]  # the bars stay readable after they close


@pytest.mark.parametrize("n", [1, 1.0, 0.1, 0.001, 1e-5, "1.0", 10000, "abc", 123456.0, 3.14159, -0.5, 0])
def test_tqdm_format_num_pads_as_lightnings(n):
    assert Tqdm.format_num(n) == pl_tqdm_module.Tqdm.format_num(n)


@pytest.mark.parametrize(
    ("rate", "env", "colab"), [(0, "1", None), (1, "2", None), (2, "1", None), (1, None, "1")]
)
def test_refresh_rate_from_tqdm_miniters_and_colab_as_lightnings(monkeypatch, rate, env, colab):
    for name, value in (("TQDM_MINITERS", env), ("COLAB_GPU", colab)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    assert TQDMProgressBar(refresh_rate=rate).refresh_rate == pl.callbacks.TQDMProgressBar(rate).refresh_rate


class _Printing(BoringModel):
    def training_step(self, *args):
        self.print("training_step", end="")
        return super().training_step(*args)

    def test_step(self, *args):
        self.print("test_step", file=sys.stderr)
        return super().test_step(*args)


def test_task_print_goes_through_the_drawing_bar_with_its_keywords(tmp_path):
    t = Trainer(default_root_dir=str(tmp_path), max_steps=1, limit_val_batches=0, limit_test_batches=1,
                logger=False, enable_checkpointing=False, enable_model_summary=False)  # fmt: skip
    with mock.patch("tqdm.tqdm.write") as write:
        t.fit(_Printing())
        t.test(_Printing(), verbose=False)
    assert write.call_args_list == [
        mock.call("training_step", end=""),
        mock.call("test_step", file=sys.stderr),
    ]


def test_two_progress_bars_are_refused_as_lightning_refuses_them():
    from tandem_core.errors import ConfigError

    with pytest.raises(pl.utilities.exceptions.MisconfigurationException):
        pl.Trainer(callbacks=[pl.callbacks.TQDMProgressBar(), pl.callbacks.TQDMProgressBar()])
    with pytest.raises(ConfigError, match="2 progress bars"):
        Trainer(callbacks=[TQDMProgressBar(), TQDMProgressBar()])


# ----- LearningRateMonitor ------------------------------------------------------------------------------------
def _lr_run(lightning: bool, tmp_path, model_fn, **monitor_kw):
    import torch

    from callbacks import LearningRateMonitor
    from trainer.loggers import CSVLogger

    T, Monitor, Logger, Base = (
        (pl.Trainer, pl.callbacks.LearningRateMonitor, pl.loggers.CSVLogger, PLBoring)
        if lightning
        else (Trainer, LearningRateMonitor, CSVLogger, BoringModel)
    )
    monitor = Monitor(**monitor_kw)
    t = T(default_root_dir=str(tmp_path), max_epochs=2, limit_train_batches=5, limit_val_batches=0,
          log_every_n_steps=2, callbacks=[monitor], logger=Logger(str(tmp_path)), enable_checkpointing=False,
          enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    t.fit(model_fn(Base, torch))
    return monitor


def _two_optimizers_manual(Base, torch):
    class Two(Base):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = False

        def training_step(self, batch, batch_idx):
            for opt in self.optimizers():
                loss = self.step(batch).sum()
                opt.zero_grad()
                self.manual_backward(loss)
                opt.step()

        def on_train_epoch_end(self):
            for s in self.lr_schedulers():
                s.step()

        def configure_optimizers(self):
            a = torch.optim.Adam(self.parameters(), lr=1e-2)
            b = torch.optim.Adam(self.parameters(), lr=1e-3)
            return [a, b], [
                torch.optim.lr_scheduler.StepLR(a, 1, 0.1),
                torch.optim.lr_scheduler.StepLR(b, 1, 0.5),
            ]

    return Two()


def _named_groups(Base, torch):
    class Groups(Base):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = False

        def configure_optimizers(self):
            w, b = self.layer.weight, self.layer.bias
            sgd = torch.optim.SGD([{"params": [w], "name": "weights"}, {"params": [b]}], lr=0.1, momentum=0.9)
            rms = torch.optim.Adagrad([{"params": [self.layer.weight], "name": "only"}], lr=0.2)
            return [sgd, rms]

        def training_step(self, batch, batch_idx):
            for opt in self.optimizers():
                opt.zero_grad()
                self.manual_backward(self.step(batch).sum())
                opt.step()

    return Groups()


@pytest.mark.parametrize("interval", [None, "step", "epoch"])
def test_lr_monitor_keys_values_and_steps_as_lightnings_with_two_manual_optimizers(tmp_path, interval):
    ours = _lr_run(False, tmp_path / "t", _two_optimizers_manual, logging_interval=interval)
    theirs = _lr_run(True, tmp_path / "l", _two_optimizers_manual, logging_interval=interval)
    assert (
        ours.lrs == theirs.lrs and ours.lrs["lr-Adam-1"]
    )  # written at batches that stepped, not global steps


def test_lr_monitor_group_names_momentum_and_its_warning_as_lightnings(tmp_path):
    with pytest.warns(RuntimeWarning):  # Adagrad has no momentum
        ours = _lr_run(False, tmp_path / "t", _named_groups, log_momentum=True, log_weight_decay=True)
    with pytest.warns(RuntimeWarning):
        theirs = _lr_run(True, tmp_path / "l", _named_groups, log_momentum=True, log_weight_decay=True)
    assert list(ours.lrs) == list(theirs.lrs) == ["lr-SGD/weights", "lr-SGD/pg2", "lr-Adagrad/only"]
    assert ours.lrs == theirs.lrs
    assert ours.last_momentum_values == theirs.last_momentum_values
    assert ours.last_weight_decay_values == theirs.last_weight_decay_values


def test_lr_monitor_refuses_two_groups_of_one_name_as_lightning(tmp_path):
    from tandem_core.errors import ConfigError

    def same_names(Base, torch):
        class Same(Base):
            def configure_optimizers(self):
                groups = [
                    {"params": [self.layer.weight], "name": "x"},
                    {"params": [self.layer.bias], "name": "x"},
                ]
                return torch.optim.SGD(groups, lr=0.1)

        return Same()

    with pytest.raises(pl.utilities.exceptions.MisconfigurationException):
        _lr_run(True, tmp_path / "l", same_names)
    with pytest.raises(ConfigError, match="share the name"):
        _lr_run(False, tmp_path / "t", same_names)


# ----- loggers ------------------------------------------------------------------------------------------------
def _custom_logger(Base):
    class Custom(Base):  # Lightning's style: read-only properties, no directory
        def __init__(self):
            super().__init__()
            self.calls = []

        @property
        def save_dir(self):
            return None

        @property
        def name(self):
            return "custom"

        @property
        def version(self):
            return "1"

        @property
        def experiment(self):
            return None

        def log_hyperparams(self, params, *args, **kwargs):
            self.calls.append(("hparams", dict(params)))

        def log_metrics(self, metrics, step=None):
            self.calls.append(("metrics", sorted(metrics), step))

    return Custom()


class _StepKey:  # logs its own "step" at each epoch end
    def on_train_epoch_end(self):
        self.log_dict({"step": 10 * (self.current_epoch + 1), "train_acc": float(self.current_epoch)})


def _logger_run(lightning: bool, tmp_path):
    from trainer.loggers import Logger

    T, Base, LBase = (
        (pl.Trainer, PLBoring, pl.loggers.Logger) if lightning else (Trainer, BoringModel, Logger)
    )
    model = type("M", (_StepKey, Base), {})()
    logger = _custom_logger(LBase)
    T(default_root_dir=str(tmp_path), max_epochs=2, limit_train_batches=2, limit_val_batches=0, logger=logger,
      log_every_n_steps=1, enable_progress_bar=False, enable_model_summary=False).fit(model)  # fmt: skip
    return logger.calls


def test_a_lightning_style_logger_subclass_gets_lightnings_calls(tmp_path):
    ours, theirs = _logger_run(False, tmp_path / "t"), _logger_run(True, tmp_path / "l")
    assert ours == theirs  # no log_hyperparams without save_hyperparameters; a logged "step" is the step
    assert ("metrics", ["train_acc"], 20) in ours


def _csv_calls(Logger, root):
    import torch

    logger = Logger(str(root), flush_logs_every_n_steps=2)
    logger.log_hyperparams({"a": 1})
    logger.log_hyperparams({"b": "x"})
    logger.log_metrics({"x": torch.tensor(0.5)})  # no step: the number of rows not yet written
    pending = [dict(r) for r in logger.experiment.metrics]
    logger.log_metrics({"x": 1.0, "y": 2}, step=1)  # (1 + 1) % 2 == 0: saved
    after = list(logger.experiment.metrics)
    logger.log_metrics({"y": 3})
    logger.save()
    with open(logger.experiment.metrics_file_path) as f:
        rows = f.read().splitlines()
    with open(f"{logger.log_dir}/{logger.experiment.NAME_HPARAMS_FILE}") as f:
        hparams = f.read()
    return pending, after, rows, hparams


def test_csv_logger_experiment_rows_steps_and_hparams_as_lightnings(tmp_path):
    from trainer.loggers import CSVLogger

    ours = _csv_calls(CSVLogger, tmp_path / "t")
    theirs = _csv_calls(pl.loggers.CSVLogger, tmp_path / "l")
    assert ours == theirs
    assert ours[1] == [] and ours[3] == "a: 1\nb: x\n"


def test_hparams_yaml_functions_round_trip_as_lightnings(tmp_path):
    from argparse import Namespace

    from pytorch_lightning.core.saving import load_hparams_from_yaml as pl_load
    from pytorch_lightning.core.saving import save_hparams_to_yaml as pl_save

    from trainer.loggers.hparams_file import load_hparams_from_yaml, save_hparams_to_yaml

    hp = Namespace(batch_size=32, lr=0.001, nested={"a": [1, 2]}, name="x")
    save_hparams_to_yaml(tmp_path / "ours.yaml", hp)
    pl_save(tmp_path / "theirs.yaml", hp)
    assert (tmp_path / "ours.yaml").read_text() == (tmp_path / "theirs.yaml").read_text()
    assert load_hparams_from_yaml(tmp_path / "ours.yaml") == pl_load(tmp_path / "theirs.yaml") == vars(hp)
    assert load_hparams_from_yaml(tmp_path / "ours.yaml", use_omegaconf=False) == vars(hp)
    with pytest.warns(RuntimeWarning):
        assert load_hparams_from_yaml(tmp_path / "missing.yaml") == {}
    with pytest.raises(RuntimeError):
        save_hparams_to_yaml(tmp_path / "no" / "such.yaml", {})


def test_hparams_yaml_with_a_python_tag_is_refused_where_lightning_runs_it(tmp_path):
    import yaml

    from trainer.loggers.hparams_file import load_hparams_from_yaml

    (tmp_path / "h.yaml").write_text("f: !!python/name:os.system\n")
    with pytest.raises(yaml.YAMLError):  # Lightning's full_load would import os.system
        load_hparams_from_yaml(tmp_path / "h.yaml")


def test_csv_logger_keeps_an_earlier_metrics_file_where_lightning_deletes_it(tmp_path):
    """Deliberate difference (docs/porting.md): a version directory with a metrics.csv (a resumed run, or a
    version given twice) keeps its rows and gets the new ones appended; Lightning warns and deletes the file."""
    from trainer.loggers import CSVLogger

    first = CSVLogger(str(tmp_path), name="exp", version=0)
    first.log_metrics({"loss": 1.0}, step=0)
    first.save()
    again = CSVLogger(str(tmp_path), name="exp", version=0)
    again.log_metrics({"loss": 0.5}, step=1)
    again.save()
    assert (tmp_path / "exp" / "version_0" / "metrics.csv").read_text().splitlines() == [
        "loss,step",
        "1.0,0",
        "0.5,1",
    ]


def test_lightnings_unsupported_loggers_import_and_refuse_when_built():
    from tandem_core.errors import ConfigError
    from trainer.loggers import CometLogger, Logger

    assert issubclass(CometLogger, Logger)  # `isinstance(logger, CometLogger)` in a user's code still works
    with pytest.raises(ConfigError, match="CometLogger is not available"):
        CometLogger(api_key="k", project="p")


def test_tensorboard_logger_writes_hparams_yaml_without_hyperparameters_and_pickles_as_lightnings(tmp_path):
    import pickle

    from trainer.loggers import TensorBoardLogger

    texts = []
    for T, Logger, Model, root in (
        (Trainer, TensorBoardLogger, BoringModel, tmp_path / "t"),
        (pl.Trainer, pl.loggers.TensorBoardLogger, PLBoring, tmp_path / "l"),
    ):
        logger = Logger(save_dir=str(root), default_hp_metric=False)
        T(max_steps=1, default_root_dir=str(root), logger=logger, enable_progress_bar=False).fit(Model())
        texts.append((root / "lightning_logs" / "version_0" / "hparams.yaml").read_text())
        logger.log_metrics({"a": 1.0})
        logger.save()
        pickle.loads(pickle.dumps(logger)).log_metrics({"a": 2.0}, 1)
    assert texts[0] == texts[1] == "{}\n"


def test_a_rich_progress_bar_brings_a_rich_model_summary_as_in_lightning():
    pytest.importorskip("rich")
    from callbacks import RichModelSummary, RichProgressBar

    theirs = pl.Trainer(callbacks=pl.callbacks.RichProgressBar(), logger=False)
    assert any(isinstance(cb, pl.callbacks.RichModelSummary) for cb in theirs.callbacks)
    ours = Trainer(callbacks=RichProgressBar(), logger=False)
    assert [type(cb) for cb in ours.callbacks if isinstance(cb, RichModelSummary)] == [RichModelSummary]


class _Duck:  # a logger that is no Logger subclass: Lightning takes any object as one
    name, version, save_dir = "duck", 0, None

    def __init__(self):
        self.seen = []

    def log_metrics(self, metrics, step=None):
        self.seen.append((sorted(metrics), step))

    def log_hyperparams(self, params, *args, **kwargs):
        pass

    def log_graph(self, model, input_array=None):
        pass

    def save(self):
        pass

    def finalize(self, status):
        self.status = status


class _Logs:
    def training_step(self, batch, batch_idx):
        out = super().training_step(batch, batch_idx)
        self.log("a", out["loss"])
        return out


def test_a_duck_typed_logger_is_taken_as_lightning_takes_it(tmp_path):
    from tandem_core.errors import ConfigError

    seen = []
    for T, Base in ((Trainer, BoringModel), (pl.Trainer, PLBoring)):
        duck = _Duck()
        T(default_root_dir=str(tmp_path), max_steps=3, log_every_n_steps=1, logger=duck, enable_progress_bar=False,
          enable_checkpointing=False, enable_model_summary=False).fit(type("M", (_Logs, Base), {})())  # fmt: skip
        seen.append((duck.seen, duck.status))
    assert seen[0] == seen[1] and seen[0][1] == "success"
    with pytest.raises(ConfigError, match="logger must be"):
        Trainer(logger="tensorboard")


@pytest.mark.parametrize("logger", [True, False])
def test_fast_dev_run_logs_to_a_dummy_logger_as_lightning(tmp_path, logger):
    from trainer.loggers import DummyLogger

    theirs = pl.Trainer(default_root_dir=str(tmp_path), fast_dev_run=True, logger=logger)
    ours = Trainer(default_root_dir=str(tmp_path), fast_dev_run=True, logger=logger)
    assert [type(lg).__name__ for lg in ours.loggers] == [type(lg).__name__ for lg in theirs.loggers]
    if logger:
        assert isinstance(ours.logger, DummyLogger)
        ours.fit(type("M", (_Logs, BoringModel), {})())
        assert "v_num" not in ours.progress_bar_callback.get_metrics(ours, ours.task)
        assert not (tmp_path / "lightning_logs").exists()


# ----- RichProgressBar ----------------------------------------------------------------------------------------
def _rich_run(lightning: bool, tmp_path, train: int, val: int) -> tuple:
    from callbacks import RichProgressBar

    T, Bar, Model = (
        (pl.Trainer, pl.callbacks.RichProgressBar, PLBoring)
        if lightning
        else (Trainer, RichProgressBar, BoringModel)
    )
    bar = Bar()
    t = T(default_root_dir=str(tmp_path), num_sanity_val_steps=2, limit_train_batches=train, limit_val_batches=val,
          max_epochs=1, callbacks=bar, logger=False, enable_checkpointing=False, enable_model_summary=False)  # fmt: skip
    bar.on_train_start(t, Model())  # the display exists before fit: its updates can be counted
    with mock.patch.object(bar.progress, "update", wraps=bar.progress.update) as update:
        t.fit(Model())
        updates = update.call_count
    tasks = [(task.completed, task.total, task.visible) for task in bar.progress.tasks]
    t.validate(Model(), verbose=False)  # a new stage: a new display with its own bars
    return updates, tasks, [(task.completed, task.total) for task in bar.progress.tasks]


@pytest.mark.parametrize(("train", "val"), [(3, 2), (2, 0)])
def test_rich_bars_tasks_and_updates_as_lightnings(tmp_path, train, val):
    pytest.importorskip("rich")
    assert _rich_run(False, tmp_path / "t", train, val) == _rich_run(True, tmp_path / "l", train, val)


def test_rich_columns_take_the_theme_styles_under_lightnings_names():
    pytest.importorskip("rich")
    import callbacks.progress.rich_columns as cols
    from callbacks import RichProgressBar
    from callbacks.progress import RichProgressBarTheme

    theme = RichProgressBarTheme(batch_progress="red", time="blue", processing_speed="green")
    made = cols.columns(RichProgressBar(theme=theme))
    assert [type(c).__name__ for c in made[1:]] == list(cols._NAMES)
    assert (made[2].style, made[3].style, made[4].style) == ("red", "blue", "green")


def test_a_keyboard_interrupt_reaches_the_caller_with_the_bars_closed_and_ctrl_c_still_working(tmp_path):
    """Deliberate difference (docs/porting.md): Lightning turns a KeyboardInterrupt into sys.exit(1) and leaves
    SIGINT ignored in the process for good; Tandem closes the bars and lets the KeyboardInterrupt through."""
    import signal

    pytest.importorskip("rich")
    from callbacks import RichProgressBar

    class Interrupted(BoringModel):
        def on_train_start(self):
            raise KeyboardInterrupt

    bar = RichProgressBar()
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        Trainer(default_root_dir=str(tmp_path), fast_dev_run=True, callbacks=bar).fit(Interrupted())
    assert bar._stopped  # the live display no longer draws
    assert signal.getsignal(signal.SIGINT) is before
