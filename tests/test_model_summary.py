"""ModelSummary: the layer table and parameter totals, printed at the start of fit on rank 0."""

from __future__ import annotations

import torch
from callback_tasks import Scored, loader

from callbacks.model_summary import summarize
from trainer import Trainer


def test_summary_prints_at_fit_start(tmp_path, capsys):
    Trainer(max_epochs=1, default_root_dir=str(tmp_path), logger=False, enable_progress_bar=False).fit(
        Scored(), loader(), loader(2, 2)
    )
    out = capsys.readouterr().out
    assert "Total params" in out and "| net  | Linear | 3" in out


def test_totals_count_shared_parameters_once_and_split_frozen_ones():
    shared = torch.nn.Linear(3, 4)
    model = torch.nn.Sequential(shared, torch.nn.ReLU(), shared, torch.nn.Linear(4, 2))
    model[3].requires_grad_(False)
    unique = list(model.parameters())  # torch's own de-duplication
    trainable = sum(p.numel() for p in unique if p.requires_grad)
    frozen = sum(p.numel() for p in unique if not p.requires_grad)
    lines = summarize(model).splitlines()
    assert f"{trainable:<10}Trainable params" in lines
    assert f"{frozen:<10}Non-trainable params" in lines
    assert f"{trainable + frozen:<10}Total params" in lines
