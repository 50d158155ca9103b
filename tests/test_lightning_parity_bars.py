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
