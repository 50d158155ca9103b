"""self.log and the Trainer's metric dicts compared with Lightning 2.6 on the same small runs: logged_metrics
holds tensors, reduce_fx spellings, refused values and options, a callback's self.log, per-loader results with
add_dataloader_idx=False, the progress bar's values after a validation, fast_dev_run's step logging."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from callbacks import Callback
from tandem_core.errors import TaskError
from trainer import Task, Trainer

pl = pytest.importorskip("pytorch_lightning")
QUIET = dict(
    enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0
)
PAIRS = ((pl.LightningModule, pl.Callback), (Task, Callback))


def _data(n: int = 8) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(n, 3, generator=g)), batch_size=4)


def _task(base, **methods):
    class T(base):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(3, 1)

        def training_step(self, batch, batch_idx):
            return self.net(batch[0]).pow(2).mean()

        def validation_step(self, batch, batch_idx):
            return None

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    for k, v in methods.items():
        setattr(T, k, v)
    return T()


def _trainer(base, tmp_path, **kw):
    kw = {**QUIET, "max_epochs": 1, "default_root_dir": str(tmp_path), "logger": True, **kw}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pl.Trainer(accelerator="cpu", **kw) if base is pl.LightningModule else Trainer(**kw)


def _fit(base, task, tmp_path, val=True, **kw):
    trainer = _trainer(base, tmp_path / base.__name__, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(task, _data(), _data() if val else None)
    return trainer


def test_logged_metrics_are_tensors_and_reduce_fx_spellings_agree(tmp_path):
    def training_step(self, batch, batch_idx):
        self.log("s", float(batch_idx + 1), on_step=False, on_epoch=True, reduce_fx="SUM")
        self.log("a", float(batch_idx + 1), on_step=False, on_epoch=True, reduce_fx="avg")
        return self.net(batch[0]).pow(2).mean()

    seen = []
    for base, _ in PAIRS:
        trainer = _fit(base, _task(base, training_step=training_step), tmp_path, val=False)
        assert all(isinstance(v, torch.Tensor) for v in trainer.logged_metrics.values())
        seen.append({k: float(v) for k, v in trainer.logged_metrics.items()})
    assert seen[1] == seen[0] == {"s": 3.0, "a": 1.5}


@pytest.mark.parametrize("value", [None, {"a": 1}, "foo", [1, 2], torch.ones(2)])
def test_a_value_that_is_no_scalar_is_a_value_error(tmp_path, value):
    def training_step(self, batch, batch_idx):
        self.log("foo", value)
        return self.net(batch[0]).sum()

    for base, _ in PAIRS:
        with pytest.raises(ValueError):
            _fit(base, _task(base, training_step=training_step), tmp_path, val=False)


def test_neither_on_step_nor_on_epoch_and_two_different_calls_are_refused(tmp_path):
    def nothing(self, batch, batch_idx):
        self.log("foo", 1.0, on_step=False, on_epoch=False)
        return self.net(batch[0]).sum()

    def twice(self, batch, batch_idx):
        self.log("foo", 1.0, prog_bar=False)
        self.log("foo", 1.0, prog_bar=True)
        return self.net(batch[0]).sum()

    errors = (pl.utilities.exceptions.MisconfigurationException, TaskError)
    for (base, _), error in zip(PAIRS, errors):
        for step in (nothing, twice):
            with pytest.raises(error):
                _fit(base, _task(base, training_step=step), tmp_path, val=False)


def test_a_callbacks_self_log_is_the_tasks(tmp_path):
    seen = []
    for base, cb_base in PAIRS:

        class Logs(cb_base):
            def on_train_epoch_start(self, trainer, task):
                self.log("start", 2.0)

            def on_train_batch_end(self, trainer, task, *args):
                self.log("batch", 3.0)

        trainer = _fit(base, _task(base), tmp_path, val=False, callbacks=[Logs()])
        seen.append({k: float(v) for k, v in trainer.callback_metrics.items()})
    assert seen[1] == seen[0] == {"start": 2.0, "batch": 3.0}


def test_results_keep_each_loaders_own_values_without_the_suffix(tmp_path):
    def test_step(self, batch, batch_idx, dataloader_idx=0):
        self.log("shared", 7.0)
        self.log(f"own_{dataloader_idx}", float(dataloader_idx + 1), add_dataloader_idx=False)

    results = []
    for base, _ in PAIRS:
        trainer = _trainer(base, tmp_path / base.__name__, logger=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            results.append(trainer.test(_task(base, test_step=test_step), [_data(), _data()], verbose=False))
    assert results[1] == results[0]
    assert results[0][1] == {"shared/dataloader_idx_1": 7.0, "own_1": 2.0}


def test_progress_bar_keeps_a_validations_step_values(tmp_path):
    seen = []
    for base, cb_base in PAIRS:

        class Bar(cb_base):
            def on_validation_batch_end(self, trainer, task, *args):
                task.log("v_step", 1.0, on_step=True, on_epoch=False, prog_bar=True)
                task.log("v_epoch", 2.0, on_step=False, on_epoch=True, prog_bar=True)

        trainer = _fit(base, _task(base), tmp_path, callbacks=[Bar()], num_sanity_val_steps=1)
        seen.append(sorted(trainer.progress_bar_metrics))
    assert seen[1] == seen[0] == ["v_epoch", "v_step"]


def test_fast_dev_run_logs_every_step(tmp_path):
    def training_step(self, batch, batch_idx):
        self.log("a", 2.0, on_step=True, on_epoch=True)
        return self.net(batch[0]).sum()

    def validation_step(self, batch, batch_idx):
        self.log("n", 3.0, on_step=True, on_epoch=True)

    seen = []
    for base, _ in PAIRS:
        task = _task(base, training_step=training_step, validation_step=validation_step)
        trainer = _fit(base, task, tmp_path, fast_dev_run=True)
        seen.append(sorted(trainer.logged_metrics))
    assert seen[1] == seen[0] == ["a_epoch", "a_step", "n_epoch", "n_step"]


def test_a_logged_metric_must_be_an_attribute_of_the_task_as_in_lightning(tmp_path):
    """A Metric logged that the task does not hold (a new one per step) is an error naming the fix; one held
    as an attribute, or named by metric_attribute=, is logged; Lightning decides the same."""
    from torchmetrics import MeanMetric

    def foreign(self, batch, batch_idx):
        self.log("m", MeanMetric())
        return self.net(batch[0]).pow(2).mean()

    def own(self, batch, batch_idx):
        self.mean.update(float(batch_idx))
        self.log("m", self.mean, on_step=False, on_epoch=True)
        return self.net(batch[0]).pow(2).mean()

    for base, _ in PAIRS:
        errors = (TaskError,) if base is Task else (pl.utilities.exceptions.MisconfigurationException,)
        with pytest.raises(errors, match="setting an attribute for the metric"):
            _fit(base, _task(base, training_step=foreign), tmp_path, val=False)
        late = _task(base, training_step=own)
        late.mean = MeanMetric()  # set after __init__, before the fit: still found
        assert float(_fit(base, late, tmp_path, val=False).logged_metrics["m"]) == 0.5
        task = _task(base, training_step=own)
        task.mean = MeanMetric()
        with pytest.raises(
            errors, match="where `name` is one of \\['mean'\\]"
        ):  # another Metric than the held one
            task.training_step = foreign.__get__(task)
            _fit(base, task, tmp_path, val=False)


def test_a_logged_metric_whose_compute_is_no_tensor_is_a_value_error_as_in_lightning(tmp_path):
    from torchmetrics import Metric

    class Pair(Metric):
        def update(self):
            pass

        def compute(self):
            return torch.tensor(1.0), torch.tensor(2.0)

    def on_train_start(self):
        self.log("pair", self.pair)

    for base, _ in PAIRS:
        task = _task(base, on_train_start=on_train_start)
        task.pair = Pair()
        with pytest.raises(ValueError, match=r"compute\(\)` return of .*'pair' must be a tensor"):
            _fit(base, task, tmp_path, val=False)


def test_a_one_element_tensor_is_logged_as_a_scalar_as_in_lightning(tmp_path):
    """Lightning's test_unsqueezed_tensor_logging, in a real training step (Lightning's sets its private
    `_current_fx_name` to log outside one; Tandem's self.log there is a TaskError)."""

    def training_step(self, batch, batch_idx):
        self.log("foo", torch.tensor([1.5]), on_epoch=True)
        return self.net(batch[0]).pow(2).mean()

    seen = []
    for base, _ in PAIRS:
        metrics = _fit(base, _task(base, training_step=training_step), tmp_path, val=False).callback_metrics
        seen.append({k: (v.ndim, float(v)) for k, v in metrics.items()})
    assert seen[1] == seen[0] == {k: (0, 1.5) for k in ("foo", "foo_step", "foo_epoch")}
