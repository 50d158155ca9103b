"""profiler="simple" | "advanced" | "pytorch": the sections are timed, and "pytorch" writes torch.profiler traces
that TensorBoard's profiler plugin reads (Chrome trace JSON under the run's log_dir)."""

from __future__ import annotations

import glob
import json
import os

import pytest
import torch

from tandem_core.errors import ConfigError
from trainer import Task, Trainer
from trainer.profiler import PyTorchProfiler, SimpleProfiler


class Tiny(Task):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        return self.net(batch[0]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def fit(tmp_path, profiler):
    data = torch.utils.data.TensorDataset(torch.randn(12, 4))
    trainer = Trainer(max_epochs=1, profiler=profiler, default_root_dir=str(tmp_path), enable_progress_bar=False,
                      enable_model_summary=False, enable_checkpointing=False)  # fmt: skip
    trainer.fit(Tiny(), torch.utils.data.DataLoader(data, batch_size=4))
    return trainer


@pytest.mark.slow  # torch.profiler's first start in a process takes ~7 s here (kineto's set-up)
def test_pytorch_profiler_writes_a_tensorboard_trace_per_stage(tmp_path):
    trainer = fit(tmp_path, "pytorch")
    assert isinstance(trainer.profiler, PyTorchProfiler)
    traces = glob.glob(os.path.join(trainer.log_dir, "fit", "rank0.*.pt.trace.json"))
    assert len(traces) == 1, os.listdir(trainer.log_dir)
    with open(traces[0]) as f:
        events = json.load(f)["traceEvents"]
    names = {e.get("name") for e in events}
    assert {
        "[pl][profile]training_step",
        "[pl][profile]backward",
        "[pl][profile]optimizer_step",
    } <= names  # sections
    assert any(str(n).startswith("aten::") for n in names)  # and torch's operators
    mine = PyTorchProfiler(dirpath=str(tmp_path / "traces"))  # an instance, with its own folder
    assert fit(tmp_path, mine).profiler is mine
    assert glob.glob(str(tmp_path / "traces" / "fit" / "rank0.*.pt.trace.json"))


def test_a_profiler_instance_is_used_as_given(tmp_path):
    simple = fit(tmp_path, SimpleProfiler()).profiler
    assert simple.calls["training_step"] == 3


def test_unknown_profilers_are_refused_by_name():
    with pytest.raises(ConfigError, match="unknown profiler 'cprofile'.*'pytorch'"):
        Trainer(profiler="cprofile")
    with pytest.raises(ConfigError, match="profiler must be a name or a Profiler"):
        Trainer(profiler=object())


DDP_SCRIPT = """
import sys, torch
from trainer import Task, Trainer

class Tiny(Task):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(4, 1)
    def training_step(self, batch, batch_idx):
        return self.net(batch[0]).pow(2).mean()
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

if __name__ == "__main__":
    data = torch.utils.data.TensorDataset(torch.randn(16, 4))
    Trainer(max_epochs=1, strategy="ddp", devices=2, accelerator="cpu", profiler="pytorch", default_root_dir=sys.argv[1],
            enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False).fit(
        Tiny(), torch.utils.data.DataLoader(data, batch_size=4))
"""


@pytest.mark.slow
def test_pytorch_profiler_under_ddp_writes_one_trace_per_rank_in_rank_0s_run(tmp_path):
    import subprocess
    import sys

    script = tmp_path / "run.py"
    script.write_text(DDP_SCRIPT)
    env = {
        k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")
    }
    out = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=300,
                         env=env)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert os.listdir(tmp_path / "lightning_logs") == ["version_0"]  # no rank claimed a version of its own
    traces = sorted(
        os.path.basename(p).split(".")[0]
        for p in glob.glob(str(tmp_path / "lightning_logs" / "version_0" / "fit" / "*.pt.trace.json"))
    )
    assert traces == ["rank0", "rank1"]


def _profiled_fit(lightning: bool, tmp_path) -> dict:
    """A fast_dev_run=2 fit (two validation loaders, a DataModule with its own hooks), test and predict with
    profiler="simple": Lightning's run and Tandem's."""
    if lightning:
        pl = pytest.importorskip("pytorch_lightning")
        from pytorch_lightning.demos.boring_classes import BoringDataModule, BoringModel

        T = pl.Trainer
    else:
        from trainer.demos import BoringDataModule, BoringModel

        T = Trainer

    class TwoVal(BoringModel):
        def validation_step(self, batch, batch_idx, dataloader_idx=0):
            return super().validation_step(batch, batch_idx)

        def val_dataloader(self):
            return [super().val_dataloader(), super().val_dataloader()]

        def on_fit_start(self):
            pass

    class DM(BoringDataModule):
        def prepare_data(self):
            pass

        def state_dict(self):
            return {"seen": 1}

    t = T(default_root_dir=str(tmp_path), fast_dev_run=2, profiler="simple", logger=False, enable_progress_bar=False,
          enable_model_summary=False)  # fmt: skip
    t.fit(TwoVal(), datamodule=DM())
    t.test(TwoVal(), datamodule=DM())
    t.predict(TwoVal(), datamodule=DM())
    return dict(t.profiler.recorded_durations)


def test_simple_profiler_records_each_duration_under_lightnings_keys(tmp_path):
    theirs, ours = _profiled_fit(True, tmp_path / "l"), _profiled_fit(False, tmp_path / "t")
    fetches = [k for k in theirs if k.endswith("_next")] + [
        k for k in theirs if k.startswith("[LightningDataModule]")
    ]
    assert len(fetches) >= 5
    for key in fetches:  # the batch fetches and the DataModule's own methods: the same keys, as often
        assert len(ours[key]) == len(theirs[key]), key
        assert all(d > 0 for d in ours[key])
    hooks = {k for k in ours if k.startswith("[")}  # the task's and the callbacks' hooks Tandem calls
    assert "[LightningModule]TwoVal.on_fit_start" in hooks and hooks <= set(theirs)
    assert len(ours["training_step"]) == 2  # and the loop's own sections
