"""Loop behaviour compared with Lightning itself (pytorch_lightning, the reference extra): the dataloader_idx
argument checked when an evaluation starts, the default predict_step with several loaders, and the progress
bar's values across epochs."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

pl = pytest.importorskip("pytorch_lightning")
from pytorch_lightning.demos import boring_classes as plb  # noqa: E402

from tandem_core.errors import TandemError  # noqa: E402
from trainer import Trainer, demos  # noqa: E402
from trainer.loop.signatures import DataloaderIdxError  # noqa: E402

QUIET = dict(logger=False, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)


def _trainer(lightning: bool, tmp_path: Any, **kwargs: Any) -> Any:
    cls = pl.Trainer if lightning else Trainer
    return cls(default_root_dir=tmp_path / str(lightning), **{**QUIET, **kwargs})


def _raises(lightning: bool, tmp_path: Any, make: Any, stage: str, loaders: int) -> type | None:
    base = plb.BoringModel if lightning else demos.BoringModel
    data = [DataLoader(plb.RandomDataset(32, 4)) for _ in range(loaders)]
    try:
        getattr(_trainer(lightning, tmp_path, limit_val_batches=1, limit_test_batches=1), stage)(
            make(base), data if loaders > 1 else data[0]
        )
    except Exception as e:  # the class Lightning raises, and ours
        return type(e)
    return None


def _required(base: type) -> Any:
    class M(base):  # type: ignore[misc,valid-type]
        def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int) -> None: ...

        def test_step(self, batch: Any, batch_idx: int, dataloader_idx: int) -> None: ...

    return M()


def _hook_required(base: type) -> Any:
    class M(base):  # type: ignore[misc,valid-type]
        def on_validation_batch_end(
            self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int
        ) -> None: ...

    return M()


def _missing(base: type) -> Any:
    class M(base):  # type: ignore[misc,valid-type]
        def validation_step(self, batch: Any, batch_idx: int) -> None: ...

        def test_step(self, batch: Any, batch_idx: int) -> None: ...

    return M()


def _defaulted(base: type) -> Any:
    class M(base):  # type: ignore[misc,valid-type]
        def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...

        def test_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...

    return M()


@pytest.mark.parametrize(
    ("make", "loaders", "error"),
    [
        (_required, 1, True),
        (_hook_required, 1, True),
        (_missing, 2, True),
        (_defaulted, 1, False),
        (_defaulted, 2, False),
    ],
)
@pytest.mark.parametrize("stage", ["validate", "test"])
def test_dataloader_idx_signature_is_checked_as_lightning_does(
    tmp_path: Any, make: Any, loaders: int, error: bool, stage: str
) -> None:
    if make is _hook_required and stage == "test":
        pytest.skip("the validation hook only")
    theirs = _raises(True, tmp_path, make, stage, loaders)
    ours = _raises(False, tmp_path, make, stage, loaders)
    assert (theirs is RuntimeError) is error
    assert (ours is DataloaderIdxError) is error
    if error:
        assert issubclass(ours, RuntimeError)


def test_default_predict_step_takes_the_dataloader_idx_of_several_loaders(tmp_path: Any) -> None:
    def make(base: type) -> Any:
        class M(base):  # type: ignore[misc,valid-type]
            def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int) -> Any:
                return super().predict_step(batch, batch_idx, dataloader_idx)  # the default, with all three

        return M()

    data = [DataLoader(plb.RandomDataset(32, 4)), DataLoader(plb.RandomDataset(32, 6))]
    ours = _trainer(False, tmp_path).predict(make(demos.BoringModel), data)
    theirs = _trainer(True, tmp_path).predict(make(plb.BoringModel), data)
    assert [len(x) for x in ours] == [len(x) for x in theirs] == [4, 6]


def _bar_metrics(lightning: bool, tmp_path: Any) -> dict[str, float]:
    base = plb.BoringModel if lightning else demos.BoringModel

    class M(base):  # type: ignore[misc,valid-type]
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            self.log_dict({"step_metric": torch.tensor(-1.0), "shared": 100.0}, logger=False, prog_bar=True)
            return super().training_step(batch, batch_idx)

        def on_train_epoch_end(self) -> None:
            epoch = self.current_epoch
            self.log_dict({f"epoch_{epoch}": float(epoch), "shared": 111.0}, logger=False, prog_bar=True)

    trainer = _trainer(lightning, tmp_path, max_epochs=3, limit_train_batches=2, limit_val_batches=0)
    trainer.fit(M())
    return {k: float(v) for k, v in trainer.progress_bar_metrics.items()}


def test_progress_bar_keeps_earlier_epochs_values_and_the_later_value_of_a_shared_name(tmp_path: Any) -> None:
    ours, theirs = _bar_metrics(False, tmp_path), _bar_metrics(True, tmp_path)
    assert ours == theirs
    assert ours["shared"] == 111.0 and ours["epoch_0"] == 0.0


def _checkpoint(lightning: bool, tmp_path: Any, strict_loading: bool | None) -> tuple[type, str]:
    base = plb.BoringModel if lightning else demos.BoringModel

    class Loading(base):  # type: ignore[misc,valid-type]
        def __init__(self) -> None:
            super().__init__()
            if strict_loading is not None:
                self.strict_loading = strict_loading

    trainer = _trainer(lightning, tmp_path, max_steps=1, limit_val_batches=0)
    trainer.fit(Loading())
    path = str(tmp_path / f"{lightning}.ckpt")
    trainer.save_checkpoint(path)
    return Loading, path


@pytest.mark.parametrize(
    ("strict", "strict_loading"), [(True, False), (False, True), (None, False), (True, None)]
)
def test_load_from_checkpoint_refuses_strict_against_the_tasks_strict_loading(
    tmp_path: Any, strict: bool | None, strict_loading: bool | None
) -> None:
    raised = []
    for lightning in (True, False):
        cls, path = _checkpoint(lightning, tmp_path, strict_loading)
        try:
            cls.load_from_checkpoint(path, strict=strict)
            raised.append(False)
        except ValueError:  # Lightning's ValueError; ours a ConfigError, which is one
            raised.append(True)
    conflict = strict is not None and strict_loading is not None and strict != strict_loading
    assert raised == [conflict, conflict]


def test_load_from_checkpoint_warns_on_an_empty_state_dict(tmp_path: Any) -> None:
    for lightning in (True, False):
        cls, path = _checkpoint(lightning, tmp_path, None)
        ckpt = torch.load(path, weights_only=True)
        ckpt["state_dict"] = {}
        torch.save(ckpt, path)
        with pytest.warns(UserWarning, match="no parameters"):
            cls.load_from_checkpoint(path, strict=False)


def _clipping(lightning: bool, tmp_path: Any, how: str, **trainer_kwargs: Any) -> Any:
    base = plb.BoringModel if lightning else demos.BoringModel
    seen: list[float] = []

    class Clipping(base):  # type: ignore[misc,valid-type]
        def configure_gradient_clipping(
            self, optimizer: Any, gradient_clip_val: Any, gradient_clip_algorithm: Any
        ):
            if how == "plain":  # no arguments: the Trainer's gradient_clip_val/algorithm
                self.clip_gradients(optimizer)
            elif how == "val":
                self.clip_gradients(optimizer, gradient_clip_val=0.01)
            else:
                self.clip_gradients(optimizer, gradient_clip_algorithm="value")
            seen.append(float(torch.cat([p.grad.flatten() for p in self.parameters()]).norm()))

    torch.manual_seed(0)
    task = Clipping()
    try:
        _trainer(lightning, tmp_path, max_steps=2, limit_val_batches=0, **trainer_kwargs).fit(task)
    except Exception as e:
        return type(e)
    return seen


def test_clip_gradients_uses_and_checks_the_trainers_values_as_lightning(tmp_path: Any) -> None:
    ours = _clipping(False, tmp_path, "plain", gradient_clip_val=1e-3)
    theirs = _clipping(True, tmp_path, "plain", gradient_clip_val=1e-3)
    assert ours == pytest.approx(theirs) and max(ours) <= 1e-3 + 1e-6  # clipped to the Trainer's value
    assert (
        _clipping(True, tmp_path, "val", gradient_clip_val=1e-4)
        is pl.utilities.exceptions.MisconfigurationException
    )
    assert issubclass(_clipping(False, tmp_path, "val", gradient_clip_val=1e-4), TandemError)
    mismatch = {"gradient_clip_algorithm": "norm"}
    assert _clipping(True, tmp_path, "algo", **mismatch) is pl.utilities.exceptions.MisconfigurationException
    assert issubclass(_clipping(False, tmp_path, "algo", **mismatch), TandemError)
    # agreeing values, or none set in the Trainer: clipped as asked
    assert _clipping(False, tmp_path, "val") == pytest.approx(_clipping(True, tmp_path, "val"))


def test_an_attached_task_is_scriptable_as_a_lightning_module(tmp_path: Any) -> None:
    task = demos.BoringModel()
    task.trainer = Trainer(default_root_dir=tmp_path, **QUIET)
    scripted = torch.jit.script(task)
    x = torch.randn(2, 32)
    assert torch.equal(scripted(x), task(x))


def _fit_error(lightning: bool, tmp_path: Any, make: Any) -> type | None:
    try:
        _trainer(lightning, tmp_path, fast_dev_run=1).fit(
            make(plb.BoringModel if lightning else demos.BoringModel)
        )
    except Exception as e:
        return type(e)
    return None


def _no_closure_call(base: type) -> Any:
    class M(base):  # type: ignore[misc,valid-type]
        def optimizer_step(
            self,
            epoch: Any = None,
            batch_idx: Any = None,
            optimizer: Any = None,
            optimizer_closure: Any = None,
            **_: Any,
        ) -> None:
            pass  # never calls optimizer_closure()

    return M()


def _broken_optimizer(base: type) -> Any:
    class M(base):  # type: ignore[misc,valid-type]
        def configure_optimizers(self) -> Any:
            class BrokenSGD(torch.optim.SGD):
                def step(self, closure: Any = None) -> Any:
                    return super().step()  # drops the closure

            return BrokenSGD(self.parameters(), lr=0.1)

    return M()


def _manual_int(base: type) -> Any:
    class M(base):  # type: ignore[misc,valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            return 5

    return M()


@pytest.mark.parametrize("make", [_no_closure_call, _broken_optimizer, _manual_int])
def test_a_step_that_trains_nothing_is_refused_as_lightning(tmp_path: Any, make: Any) -> None:
    assert _fit_error(True, tmp_path, make) is pl.utilities.exceptions.MisconfigurationException
    assert issubclass(_fit_error(False, tmp_path, make) or type(None), TandemError)


def _none_batches(lightning: bool, tmp_path: Any) -> tuple[list[Any], int, int]:
    from torch.utils.data import default_collate

    base = plb.BoringModel if lightning else demos.BoringModel
    ends: list[Any] = []

    class M(base):  # type: ignore[misc,valid-type]
        counter = 0

        def collate(self, rows: Any) -> Any:
            out = None if self.counter % 2 == 0 else default_collate(rows)
            self.counter += 1
            return out

        def train_dataloader(self) -> DataLoader:
            return DataLoader(plb.RandomDataset(32, 4), collate_fn=self.collate)

        def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
            ends.append(None if outputs is None else sorted(outputs))

    trainer = _trainer(lightning, tmp_path, max_epochs=2, limit_val_batches=0)
    with pytest.warns(UserWarning, match="yielded None"):
        trainer.fit(M())
    return ends, trainer.global_step, trainer.current_epoch


def test_a_none_batch_skips_the_step_as_lightning(tmp_path: Any) -> None:
    ours, theirs = _none_batches(False, tmp_path), _none_batches(True, tmp_path)
    assert ours == theirs
    assert ours[0] == [None, ["loss"], None, ["loss"]] * 2 and ours[1] == 4


@pytest.mark.parametrize("frozen", [True, False])
def test_training_that_starts_with_modules_in_eval_mode_is_said_as_lightning(
    tmp_path: Any, frozen: bool
) -> None:
    import warnings

    from trainer.utilities import PossibleUserWarning

    said = []
    for lightning, category in (
        (True, pl.utilities.warnings.PossibleUserWarning),
        (False, PossibleUserWarning),
    ):
        task = (plb.BoringModel if lightning else demos.BoringModel)()
        if frozen:
            task.extra = torch.nn.Linear(32, 16)
            task.extra.eval()
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            _trainer(lightning, tmp_path, max_steps=1, limit_val_batches=0).fit(task)
        said.append(sum(issubclass(w.category, category) and "eval mode" in str(w.message) for w in seen))
    assert said == ([1, 1] if frozen else [0, 0])


@pytest.mark.parametrize("batch_sampler", [False, True])
def test_set_epoch_calls_on_training_and_evaluation_samplers_equal_lightnings(
    tmp_path: Any, batch_sampler: bool
) -> None:
    from unittest import mock

    from torch.utils.data import BatchSampler, RandomSampler

    def loader() -> tuple[DataLoader, Any]:
        data = plb.RandomDataset(32, 16)
        sampler = RandomSampler(data)
        sampler.set_epoch = mock.Mock()  # type: ignore[attr-defined]
        if batch_sampler:
            return DataLoader(data, batch_sampler=BatchSampler(sampler, 2, True)), sampler
        return DataLoader(data, sampler=sampler), sampler

    calls = []
    for lightning in (True, False):
        (train, ts), (val, vs), (again, gs) = loader(), loader(), loader()
        task = (plb.BoringModel if lightning else demos.BoringModel)()
        trainer = _trainer(lightning, tmp_path, max_epochs=2, limit_train_batches=1, limit_val_batches=1)
        trainer.fit(task, train, val)
        trainer.validate(task, again)
        calls.append((ts.set_epoch.mock_calls, vs.set_epoch.mock_calls, gs.set_epoch.mock_calls))
    assert calls[0] == calls[1]
    assert calls[1][0] == [mock.call(0), mock.call(1)] and calls[1][2] == [mock.call(2)]


@pytest.mark.parametrize("mode", ["max_size_cycle", "min_size", "max_size"])
def test_validate_a_combined_loader_equals_lightning(tmp_path: Any, mode: str) -> None:
    from pytorch_lightning.utilities import CombinedLoader as PlCombined

    from trainer.utilities import CombinedLoader

    results = []
    for lightning, combined in ((True, PlCombined), (False, CombinedLoader)):
        seen: list[Any] = []

        class M(plb.BoringModel if lightning else demos.BoringModel):  # type: ignore[misc]
            def validation_step(self, batch: Any, batch_idx: int, seen: list[Any] = seen) -> None:
                seen.append(batch)

        trainer = _trainer(lightning, tmp_path)
        trainer.validate(M(), combined({"a": [0, 1, 2], "b": [3, 4]}, mode))
        results.append((seen, trainer.num_sanity_val_batches, trainer.num_val_batches))
    assert results[0] == results[1]
    assert results[1][1] == []


def test_skipping_a_step_under_several_processes_is_a_runtime_error_as_lightnings() -> None:
    from trainer.loop.closure import loss_of

    with pytest.raises(RuntimeError):  # Lightning's class (its test mocks world_size=2)
        loss_of(None, 2)
    with pytest.raises(TandemError):
        loss_of(None, 2)
    assert loss_of(None, 1) is None
