"""The profilers' ``dirpath``/``filename`` and Lightning's profiler API (start/stop/profile/describe), the cProfile
``AdvancedProfiler``, the ``ModelSummary`` utility and ``has_len_all_ranks``, each compared with Lightning on the
same script."""

from __future__ import annotations

import os
import warnings
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from trainer import Task, Trainer
from trainer.profilers import AdvancedProfiler, Profiler, PyTorchProfiler, SimpleProfiler
from trainer.utilities import has_len_all_ranks
from trainer.utilities.model_summary import ModelSummary, get_human_readable_count, summarize

pl = pytest.importorskip("pytorch_lightning")
from pytorch_lightning import profilers as their_profilers  # noqa: E402
from pytorch_lightning.utilities import model_summary as their_summary  # noqa: E402
from pytorch_lightning.utilities.data import has_len_all_ranks as their_has_len  # noqa: E402

QUIET = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)


def _net(base: type) -> Any:
    class Net(base):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.body = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU())
            self.head = torch.nn.Linear(8, 2)
            self.unused = torch.nn.Linear(3, 3)
            self.example_input_array = torch.zeros(5, 4)

        def forward(self, x):
            return self.head(self.body(x))

        def training_step(self, batch, batch_idx):
            return self(batch[0]).pow(2).mean()

        def validation_step(self, batch, batch_idx):
            self.log("v", self(batch[0]).sum())

        def test_step(self, batch, batch_idx):
            self.log("t", self(batch[0]).sum())

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Net()


def _data() -> DataLoader:
    return DataLoader(
        TensorDataset(torch.randn(8, 4, generator=torch.Generator().manual_seed(1))), batch_size=4
    )


def _stages(make: Any, base: type, profiler: Any, root: Any) -> None:
    trainer = make(default_root_dir=root, max_epochs=1, limit_train_batches=2, limit_val_batches=1,
                   limit_test_batches=1, profiler=profiler, **QUIET)  # fmt: skip
    model = _net(base)
    trainer.fit(model, _data(), _data())
    trainer.validate(model, _data(), verbose=False)
    trainer.test(model, _data(), verbose=False)


@pytest.mark.parametrize("kind", ["SimpleProfiler", "AdvancedProfiler"])
@pytest.mark.parametrize("dirpath", [True, False])
def test_each_stage_writes_lightnings_report_file(tmp_path, kind, dirpath):
    listed, fit_in_test = {}, {}
    for side, module, make, base in (
        ("lightning", their_profilers, pl.Trainer, pl.LightningModule),
        ("tandem", __import__("trainer.profilers", fromlist=["x"]), Trainer, Task),
    ):
        root = tmp_path / side
        out = root / "reports" if dirpath else None
        profiler = getattr(module, kind)(dirpath=out, filename="perf")
        _stages(make, base, profiler, root)
        where = (
            out if dirpath else root
        )  # without dirpath: the run's log_dir (default_root_dir without a logger)
        assert str(profiler.dirpath) == str(where)
        listed[side] = sorted(f for f in os.listdir(where) if f.endswith(".txt"))
        for name in listed[side]:
            assert "Profiler Report" in (where / name).read_text(), (side, name)
        fit_in_test[side] = (
            "training_step" in (where / "test-perf.txt").read_text()
        )  # a stage's report holds all
    assert listed["tandem"] == listed["lightning"] == ["fit-perf.txt", "test-perf.txt", "validate-perf.txt"]
    assert fit_in_test["tandem"] == fit_in_test["lightning"]


def test_start_stop_and_profile_follow_lightnings_rules():
    for profiler in (SimpleProfiler(), their_profilers.SimpleProfiler()):
        with pytest.raises(ValueError, match="never started"):
            profiler.stop("a")
        profiler.start("a")
        with pytest.raises(ValueError, match="already started"):
            profiler.start("a")
        profiler.stop("a")
        with profiler.profile("b") as name:
            assert name == "b"
        assert [len(profiler.recorded_durations[k]) for k in ("a", "b")] == [1, 1]
    for profiler in (AdvancedProfiler(), their_profilers.AdvancedProfiler()):
        with pytest.raises(ValueError, match="never started"):
            profiler.stop("x")
        with profiler.profile("work"):
            sum(i * i for i in range(1000))
        assert "work" in profiler.profiled_actions and "Profile stats for: work" in profiler.summary()


def test_advanced_profiler_dumps_each_actions_stats_as_lightning(tmp_path):
    names = {}
    for side, cls in (("lightning", their_profilers.AdvancedProfiler), ("tandem", AdvancedProfiler)):
        profiler = cls(dirpath=tmp_path / side, dump_stats=True)
        with profiler.profile("a/b:c"):
            sum(range(100))
        profiler.describe()
        names[side] = sorted(os.listdir(tmp_path / side))
    assert names["tandem"] == names["lightning"] == ["a_b_c.prof"]


def test_a_subclass_of_profiler_times_the_loop_through_start_and_stop(tmp_path):
    class Counting(Profiler):
        def __init__(self):
            super().__init__()
            self.started: list[str] = []

        def start(self, action_name):
            self.started.append(action_name)

        def stop(self, action_name):
            pass

    profiler = Counting()
    Trainer(default_root_dir=tmp_path, max_steps=2, profiler=profiler, **QUIET).fit(_net(Task), _data())
    assert {"[_TrainingEpochLoop].train_dataloader_next", "training_step", "backward"} <= set(
        profiler.started
    )


def test_pytorch_profiler_arguments_as_lightnings(tmp_path):
    for key in ("row_limit", "sort_by", "no_such_argument"):
        with pytest.raises(KeyError):
            their_profilers.PyTorchProfiler(table_kwargs={key: None})
        with pytest.raises(KeyError):
            PyTorchProfiler(table_kwargs={key: None})
    widths = []
    for width in (5, 30):
        profiler = PyTorchProfiler(
            dirpath=tmp_path, filename="p", table_kwargs={"max_name_column_width": width}
        )
        with profiler.profile("a"):
            torch.ones(4).sum()
        profiler.describe()
        names = {e.name for e in profiler.function_events}
        assert "[pl][profile]a" in names and "aten::ones" in names  # Lightning's range name, and torch's ops
        widths.append(profiler.summary().count("-"))
    assert widths[0] < widths[1]


def test_model_summary_utility_is_lightnings():
    for depth in (0, 1, -1):
        mine, real = (
            ModelSummary(_net(Task), max_depth=depth),
            their_summary.ModelSummary(_net(pl.LightningModule), depth),
        )
        for attr in ("layer_names", "layer_types", "param_nums", "in_sizes", "out_sizes", "training_modes",
                     "total_parameters", "trainable_parameters", "total_layer_params", "model_size",
                     "total_training_modes"):  # fmt: skip
            assert getattr(mine, attr) == getattr(real, attr), (depth, attr)
    task, model = _net(Task), _net(pl.LightningModule)
    mine, real = summarize(task), their_summary.summarize(model)
    task.head.eval(), model.head.eval()  # read when asked, as Lightning's
    assert mine.total_training_modes == real.total_training_modes == {"train": 4, "eval": 1}
    for n in (0, 7, 123, 1234, 12_345_678, 10**13):
        assert get_human_readable_count(n) == their_summary.get_human_readable_count(n)
    with pytest.raises(ValueError):
        ModelSummary(task, max_depth="deep")  # type: ignore[arg-type]


def test_has_len_all_ranks_as_lightnings():
    tt, lt = Trainer(accelerator="cpu", **QUIET), pl.Trainer(accelerator="cpu", **QUIET)
    loaders = [DataLoader(TensorDataset(torch.zeros(n, 1))) for n in (0, 3)]
    loaders.append(DataLoader(_Endless(), batch_size=None))  # no length
    for loader in loaders:
        seen = []
        for fn, strategy in ((has_len_all_ranks, tt.strategy), (their_has_len, lt.strategy)):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                seen.append((fn(loader, strategy), any("zero" in str(w.message) for w in caught)))
        assert seen[0] == seen[1]


class _Endless(torch.utils.data.IterableDataset):
    def __iter__(self):
        while True:
            yield torch.zeros(1)
