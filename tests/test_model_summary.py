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


class Encoder(torch.nn.Module):
    """Lightning's summary of this module with example_input_array set, recorded from Lightning 2.6.6
    (pytorch_lightning.utilities.model_summary.ModelSummary(model, max_depth))."""

    def __init__(self) -> None:
        super().__init__()
        self.enc = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU())
        self.head = torch.nn.Linear(16, 2)
        self.example_input_array = torch.randn(3, 8)

    def forward(self, x):
        return self.head(self.enc(x))


LIGHTNING_DEPTH_2 = """\
  | Name  | Type       | Params | Mode  | FLOPs | In sizes | Out sizes
----------------------------------------------------------------------------
0 | enc   | Sequential | 144    | train | 768   | [3, 8]   | [3, 16]
1 | enc.0 | Linear     | 144    | train | 768   | [3, 8]   | [3, 16]
2 | enc.1 | ReLU       | 0      | train | 0     | [3, 16]  | [3, 16]
3 | head  | Linear     | 34     | train | 192   | [3, 16]  | [3, 2]
----------------------------------------------------------------------------
178       Trainable params
0         Non-trainable params
178       Total params
0.001     Total estimated model params size (MB)
4         Modules in train mode
0         Modules in eval mode
960       Total Flops"""


def test_the_table_is_lightnings_with_flops_and_sizes_from_the_example_input():
    model = Encoder()
    # (Lightning pads each cell to its column's width: the rows end in spaces)
    assert [
        line.rstrip() for line in summarize(model, max_depth=2).splitlines()
    ] == LIGHTNING_DEPTH_2.splitlines()
    assert model.training and all(m.training for m in model.modules())  # the example ran in eval mode


class WithExample(Scored):
    def __init__(self) -> None:
        super().__init__()
        self.example_input_array = torch.zeros(5, 2)

    def forward(self, x):
        return self.net(x)


def test_fit_prints_in_and_out_sizes_when_the_task_has_an_example(tmp_path, capsys):
    Trainer(max_epochs=1, default_root_dir=str(tmp_path), logger=False, enable_progress_bar=False).fit(
        WithExample(), loader(), loader(2, 2)
    )
    out = capsys.readouterr().out
    assert "In sizes | Out sizes" in out and "[5, 2]   | [5, 1]" in out and "20        Total Flops" in out
