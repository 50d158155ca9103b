"""RichModelSummary: the same summary as a rich table, read back as text."""

from __future__ import annotations

import io

import pytest
from test_model_summary import Encoder

pytest.importorskip("rich", reason="the rich extra: pip install 'tandem-trainer[rich]'")

from rich.console import Console  # noqa: E402

from callbacks import RichModelSummary  # noqa: E402
from callbacks.summary.table import summarize  # noqa: E402


def test_rich_table_holds_the_columns_and_totals(monkeypatch):
    buf = io.StringIO()
    monkeypatch.setattr("rich.get_console", lambda: Console(file=buf, width=120, color_system=None))
    s = summarize(Encoder(), 1)
    RichModelSummary.summarize(
        s.columns,
        s.total_parameters,
        s.trainable_parameters,
        s.model_size,
        s.total_training_modes,
        s.total_flops,
    )
    text = buf.getvalue()
    rows = [[c.strip() for c in line.strip("│┃ ").split("│")] for line in text.splitlines() if "│" in line]
    assert ["0", "enc", "Sequential", "144", "train", "768", "[3, 8]", "[3, 16]"] in rows
    assert ["1", "head", "Linear", "34", "train", "192", "[3, 16]", "[3, 2]"] in rows
    assert "Trainable params: 178" in text and "Total FLOPs: 960" in text and "In sizes" in text


def test_needs_rich(monkeypatch):
    import importlib.util
    import sys

    from tandem_core.errors import MissingExtraError

    monkeypatch.delitem(sys.modules, "rich", raising=False)  # (an imported module counts as installed)
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "rich" else real(name, *a)
    )
    with pytest.raises(MissingExtraError, match=r"tandem-trainer\[rich\]"):
        RichModelSummary()
