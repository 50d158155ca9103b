"""RichProgressBar: training, validation and test bars read back as text from a rich console."""

from __future__ import annotations

import re

import pytest
from callback_tasks import Scored, loader

pytest.importorskip("rich", reason="the rich extra: pip install 'tandem-trainer[rich]'")

from callbacks import RichProgressBar  # noqa: E402
from callbacks.progress.rich_bar import RichProgressBarTheme  # noqa: E402
from trainer import Trainer  # noqa: E402


class WithTest(Scored):
    def test_step(self, batch, batch_idx):
        self.log("test/x", 1.0)


ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def test_bars_show_epochs_batches_and_metrics(tmp_path):
    out = tmp_path / "bar.txt"
    with open(out, "w") as f:
        bar = RichProgressBar(leave=True, console_kwargs={"file": f, "force_terminal": True, "width": 140})
        trainer = Trainer(max_epochs=2, default_root_dir=str(tmp_path), callbacks=[bar], logger=False,
                          enable_model_summary=False, enable_checkpointing=False)  # fmt: skip
        trainer.fit(Scored(), loader(), loader(2, 2))
        trainer.test(WithTest(), loader(4, 2), verbose=False)
    text = ANSI.sub("", out.read_text())
    assert "Epoch 0/1" in text and "Epoch 1/1" in text
    assert "2/2" in text and "it/s" in text
    assert re.search(r"train/loss: \d\.\d{3}", text) and "val/score: 0.000" in text
    assert "Testing" in text


def test_theme_and_refresh_rate_zero(tmp_path, capsys):
    theme = RichProgressBarTheme(metrics_format=".1e")
    bar = RichProgressBar(refresh_rate=0, theme=theme)
    assert bar.is_disabled and bar.theme.metrics_format == ".1e"
    Trainer(max_epochs=1, default_root_dir=str(tmp_path), callbacks=[bar], logger=False,
            enable_model_summary=False, enable_checkpointing=False).fit(Scored(), loader())  # fmt: skip
    assert "Epoch" not in capsys.readouterr().out
