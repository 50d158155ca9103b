"""Progress bars, model summaries and the LR monitor compared with Lightning's on the same small runs (issue 36)."""

from __future__ import annotations

import sys
import time
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


def test_a_rich_progress_bar_brings_a_rich_model_summary_as_in_lightning():
    pytest.importorskip("rich")
    from callbacks import RichModelSummary, RichProgressBar

    theirs = pl.Trainer(callbacks=pl.callbacks.RichProgressBar(), logger=False)
    assert any(isinstance(cb, pl.callbacks.RichModelSummary) for cb in theirs.callbacks)
    ours = Trainer(callbacks=RichProgressBar(), logger=False)
    assert [type(cb) for cb in ours.callbacks if isinstance(cb, RichModelSummary)] == [RichModelSummary]


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


# ----- when the bars read the metrics ------------------------------------------------------------------------
def _metric_reads(lightning: bool, tmp_path, rich: bool, clock) -> list:
    """(stage, epoch, step, prog_bar metrics) at each get_metrics call of a 2-epoch fit (Lightning's
    test_*_progress_bar_correct_value_epoch_end run); `clock` stands in for the Tandem bar's time.monotonic."""
    import callbacks.progress.rich_bar as rich_module
    from callbacks import RichProgressBar

    T, Model = (pl.Trainer, PLBoring) if lightning else (Trainer, BoringModel)
    if rich:
        pytest.importorskip("rich")
        Bar, module = (pl.callbacks.RichProgressBar if lightning else RichProgressBar), rich_module
    else:
        Bar, module = (pl.callbacks.TQDMProgressBar if lightning else TQDMProgressBar), tqdm_module
    calls = []

    class Recording(Bar):
        def get_metrics(self, trainer, module):
            items = {k: v for k, v in super().get_metrics(trainer, module).items() if k != "v_num"}
            calls.append((trainer.state.stage.value, trainer.current_epoch, trainer.global_step, items))
            return items

    class Logs(Model):
        def training_step(self, batch, batch_idx):
            self.log("a", float(self.global_step), prog_bar=True, on_step=False, on_epoch=True, reduce_fx=max)
            return super().training_step(batch, batch_idx)

        def validation_step(self, batch, batch_idx):
            self.log("b", float(self.global_step), prog_bar=True, on_step=False, on_epoch=True, reduce_fx=max)
            return super().validation_step(batch, batch_idx)

    t = T(default_root_dir=str(tmp_path), limit_train_batches=2, limit_val_batches=2, max_epochs=2, logger=False,
          callbacks=Recording(), enable_checkpointing=False, enable_model_summary=False)  # fmt: skip
    with mock.patch.object(module, "time", mock.Mock(monotonic=clock, time=time.time)):
        t.fit(Logs())
    return [(stage, epoch, step, {k: float(v) for k, v in m.items()}) for stage, epoch, step, m in calls]


@pytest.mark.parametrize("rich", [False, True])
def test_bars_read_the_metrics_at_lightnings_moments_unless_a_read_is_too_soon(tmp_path, rich):
    """Deliberate difference (docs/porting.md): Lightning converts the prog_bar metrics (a device
    synchronization) after every training batch; Tandem at most once per min_interval_s (tqdm) or
    1/refresh_rate s (rich), and always at the validation and epoch ends. With time passing between batches the
    reads are Lightning's; with a clock that stands still only the forced ones remain."""
    ticks = iter(range(10**6))
    theirs = _metric_reads(True, tmp_path / "l", rich, clock=None)
    ours = _metric_reads(False, tmp_path / "t", rich, clock=lambda: float(next(ticks)))
    assert ours == theirs
    assert ("validate", 1, 4, {"a": 1.0, "b": 4.0}) in theirs
    assert ("train", 1, 4, {"a": 3.0, "b": 4.0}) in theirs
    still = _metric_reads(False, tmp_path / "s", rich, clock=lambda: 5.0)
    assert [c for c in theirs if c in still] == still and len(still) < len(theirs)
    assert still[-2:] == theirs[-2:]  # the last validation's and the last epoch's values
