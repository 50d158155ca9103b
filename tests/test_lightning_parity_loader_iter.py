"""The `dataloader_iter` step flavor compared with Lightning itself (pytorch_lightning, the reference extra): the
same small tasks, whose steps read their batches with ``next(dataloader_iter)``, run under both trainers; the
batches each step read, the batch hooks seen with their arguments, the limits, the epoch's end (StopIteration
inside a step) and the trained weights must agree."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

pl = pytest.importorskip("pytorch_lightning")

from tandem_core.errors import ConfigError  # noqa: E402
from trainer import Task, Trainer  # noqa: E402
from trainer.loop.loader_iter import LoaderIter, takes_loader_iter  # noqa: E402

QUIET = dict(logger=False, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)


def _trainer(lightning: bool, tmp_path: Any, **kwargs: Any) -> Any:
    cls = pl.Trainer if lightning else Trainer
    return cls(default_root_dir=tmp_path / str(lightning), **{**QUIET, **kwargs})


def _data(n: int = 8, batch_size: int = 2) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    return DataLoader(torch.randn(n * batch_size, 4, generator=g), batch_size=batch_size)


class _Stream(IterableDataset):
    """Batches without a length: the end is known only once they run out."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Any:
        g = torch.Generator().manual_seed(1)
        return iter([torch.randn(2, 4, generator=g) for _ in range(self.n)])


def _task(lightning: bool, fetches: int = 1, manual: bool = False, catch: bool = False) -> Any:
    """A task whose steps read `fetches` batches each; it records what it read and every batch hook's arguments
    (batches as their sum, so that both runs compare by value)."""
    base = pl.LightningModule if lightning else Task

    def key(batch: Any) -> Any:
        return None if batch is None else round(float(batch.sum()), 4)

    class M(base):  # type: ignore[misc,valid-type]
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.layer = torch.nn.Linear(4, 1)
            self.seen: list[tuple[Any, ...]] = []
            self.automatic_optimization = not manual

        def _read(self, it: Any, stage: str) -> Any:
            got = []
            for _ in range(fetches):
                try:
                    batch, batch_idx, dl_idx = next(it)
                except StopIteration:
                    if not catch:
                        raise
                    self.seen.append((stage, "raised"))
                    break
                self.seen.append((stage, "read", key(batch), batch_idx, dl_idx))
                got.append(batch)
            return torch.cat(got) if got else None

        def training_step(self, dataloader_iter: Any) -> Any:
            x = self._read(dataloader_iter, "train")
            if x is None:
                return None
            loss = self.layer(x).pow(2).mean()
            if manual:
                opt = self.optimizers()
                opt.zero_grad()
                self.manual_backward(loss)
                opt.step()
            return loss

        def validation_step(self, dataloader_iter: Any) -> Any:
            x = self._read(dataloader_iter, "val")
            return None if x is None else self.layer(x).sum()

        def test_step(self, dataloader_iter: Any) -> Any:
            x = self._read(dataloader_iter, "test")
            return None if x is None else self.layer(x).sum()

        def predict_step(self, dataloader_iter: Any) -> Any:
            x = self._read(dataloader_iter, "predict")
            return None if x is None else self.layer(x).sum().item()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.layer.parameters(), lr=0.1)

    for stage in ("train", "validation", "test", "predict"):

        def start(self: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0, _s: str = stage) -> None:
            self.seen.append((_s, "start", key(batch), batch_idx, dataloader_idx))

        def end(
            self: Any, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0, _s: str = stage
        ) -> None:
            self.seen.append((_s, "end", key(batch), batch_idx, dataloader_idx))

        setattr(M, f"on_{stage}_batch_start", start)
        setattr(M, f"on_{stage}_batch_end", end)

    def epoch_end(self: Any) -> None:
        self.seen.append(("train", "epoch_end"))

    def val_start(self: Any) -> None:
        self.seen.append(("validation", "begin"))

    M.on_train_epoch_end = epoch_end
    M.on_validation_start = val_start
    return M()


def _fit(lightning: bool, tmp_path: Any, train: Any, val: Any = None, **kwargs: Any) -> Any:
    task = _task(lightning, **{k: kwargs.pop(k) for k in ("fetches", "manual", "catch") if k in kwargs})
    kwargs.setdefault("max_epochs", 1)
    kwargs.setdefault("num_sanity_val_steps", 0)
    _trainer(lightning, tmp_path, **kwargs).fit(task, train, val)
    return task.seen, [p.detach().clone() for p in task.layer.parameters()]


def _same(tmp_path: Any, *args: Any, **kwargs: Any) -> list[tuple[Any, ...]]:
    (want, w_want), (got, w_got) = (_fit(lt, tmp_path, *args, **dict(kwargs)) for lt in (True, False))
    assert got == want
    for a, b in zip(w_got, w_want):
        torch.testing.assert_close(a, b)
    return got


@pytest.mark.parametrize("manual", [False, True])
def test_fit_two_reads_per_step_with_validation(tmp_path: Any, manual: bool) -> None:
    """Each step reads two batches: four steps an epoch, the hooks see the batch read last, validation (also
    reading two per step) at the epoch's end; the same weights."""
    seen = _same(tmp_path, _data(8), _data(4), fetches=2, manual=manual, max_epochs=2)
    assert sum(1 for s in seen if s[:2] == ("train", "read")) == 16
    assert seen[0] == ("train", "start", None, 0, 0)  # nothing fetched yet


def test_fit_limits_cap_the_iterator(tmp_path: Any) -> None:
    """limit_train_batches=3 and limit_val_batches=2 cap what the iterators yield: the second step's second read
    finds the training data exhausted (caught by the task), and the sanity check reads its 2 batches."""
    seen = _same(
        tmp_path, _data(8), _data(4), fetches=2, catch=True, limit_train_batches=3, limit_val_batches=2,
        num_sanity_val_steps=2,
    )  # fmt: skip
    assert ("train", "raised") in seen


def test_fit_stop_iteration_inside_the_step_ends_the_epoch(tmp_path: Any) -> None:
    """A loader without a length: the step that finds it exhausted lets StopIteration out, which ends the epoch
    (no on_train_batch_end for it, and as Lightning no validation at that epoch's end)."""
    _same(tmp_path, DataLoader(_Stream(5), batch_size=None), _data(2), fetches=2, max_epochs=2)


@pytest.mark.parametrize("stage", ["validate", "test", "predict"])
def test_evaluation_stages(tmp_path: Any, stage: str) -> None:
    """validate, test and predict over two loaders with a limit: one iterator crossing both loaders, its
    dataloader_idx switching, the batch hooks getting it; predict's outputs grouped per loader."""
    outs = {}
    for lightning in (True, False):
        task = _task(lightning, fetches=1)
        trainer = _trainer(
            lightning, tmp_path, limit_val_batches=3, limit_test_batches=3, limit_predict_batches=3
        )
        out = getattr(trainer, stage)(task, [_data(4), _data(2, batch_size=3)])
        outs[lightning] = (task.seen, out if stage == "predict" else None)
    assert outs[False] == outs[True]


def test_training_iterator_over_a_dict_of_loaders(tmp_path: Any) -> None:
    """Several training loaders (a dict): the iterator yields the combined batches with dataloader_idx 0."""
    base = {True: pl.LightningModule, False: Task}
    reads: dict[bool, list[Any]] = {}
    for lightning in (True, False):

        class M(base[lightning]):  # type: ignore[misc,valid-type]
            def __init__(self) -> None:
                super().__init__()
                self.layer, self.reads = torch.nn.Linear(1, 1), []

            def training_step(self, dataloader_iter: Any) -> Any:
                self.reads.append(next(dataloader_iter))
                return None

            def configure_optimizers(self) -> Any:
                return torch.optim.SGD(self.layer.parameters(), lr=0.1)

        task = M()
        _trainer(lightning, tmp_path, max_epochs=1, limit_train_batches=3).fit(
            task, {"a": [0, 1, 2], "b": [5, 6]}
        )
        reads[lightning] = task.reads
    assert (
        reads[False]
        == reads[True]
        == [({"a": 0, "b": 5}, 0, 0), ({"a": 1, "b": 6}, 1, 0), ({"a": 2, "b": 5}, 2, 0)]
    )


def test_signature_rule_matches_lightning() -> None:
    """A parameter named dataloader_iter selects the flavor (as Lightning's explicit check); *args does not."""
    from pytorch_lightning.utilities.signature_utils import is_param_in_hook_signature

    class A:
        def plain(self, batch: Any, batch_idx: int) -> None: ...

        def it(self, dataloader_iter: Any) -> None: ...

        def star(self, *args: Any) -> None: ...

    for name in ("plain", "it", "star"):
        fn = getattr(A(), name)
        assert takes_loader_iter(fn) == is_param_in_hook_signature(fn, "dataloader_iter", explicit=True)


def test_loader_iter_length_and_done() -> None:
    it = LoaderIter(iter([(10, 0, 0), (11, 1, 0), (12, 2, 0)]), 2)
    assert next(it) == (10, 0, 0) and not it.done
    assert next(it) == (11, 1, 0) and it.done and it.fetched == 2
    with pytest.raises(StopIteration):
        next(it)
    assert (it.batch, it.batch_idx) == (11, 1)


def test_unknown_length_under_several_processes_is_refused() -> None:
    """Tandem's own rule (Lightning would let the ranks drift apart): no length, several ranks -> ConfigError."""
    from trainer.loop.loader_iter import check_world_size

    class T:
        world_size = 2

    with pytest.raises(ConfigError, match="unknown length"):
        check_world_size(T(), float("inf"), "training_step")
    check_world_size(T(), 4, "training_step")


@pytest.mark.parametrize("with_size", [False, True])
def test_log_in_training_needs_batch_size(tmp_path: Any, with_size: bool) -> None:
    """self.log in a dataloader_iter training_step: without batch_size an error (the loop cannot size the batches
    the step read: Lightning's MisconfigurationException, Tandem's TaskError); with it, the same epoch value."""
    from pytorch_lightning.utilities.exceptions import MisconfigurationException

    from tandem_core.errors import TaskError

    base = {True: pl.LightningModule, False: Task}
    logged = {}
    for lightning in (True, False):

        class M(base[lightning]):  # type: ignore[misc,valid-type]
            def __init__(self) -> None:
                super().__init__()
                torch.manual_seed(0)
                self.layer = torch.nn.Linear(4, 1)

            def training_step(self, dataloader_iter: Any) -> Any:
                batch, _, _ = next(dataloader_iter)
                loss = self.layer(batch).pow(2).mean()
                self.log("loss", loss, on_epoch=True, **({"batch_size": len(batch)} if with_size else {}))
                return loss

            def configure_optimizers(self) -> Any:
                return torch.optim.SGD(self.layer.parameters(), lr=0.1)

        task, trainer = M(), _trainer(lightning, tmp_path, max_epochs=1)
        if with_size:
            trainer.fit(task, _data(4))
            logged[lightning] = float(trainer.callback_metrics["loss_epoch"])
        else:
            with pytest.raises(MisconfigurationException if lightning else TaskError, match="batch_size"):
                trainer.fit(task, _data(4))
    if with_size:
        assert logged[False] == pytest.approx(logged[True])


def _plain_lightning(sched: bool) -> Any:
    """The reference: the same model trained by Lightning with an ordinary (batch, batch_idx) step."""

    class P(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            return self.layer(batch).pow(2).mean()

        def configure_optimizers(self) -> Any:
            opt = torch.optim.SGD(self.layer.parameters(), lr=0.1)
            return ([opt], [torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)]) if sched else opt

    return P()


def _with_step_lr(task: Any) -> Any:
    def configure_optimizers() -> Any:
        opt = torch.optim.SGD(task.layer.parameters(), lr=0.1)
        return [opt], [torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)]

    task.configure_optimizers = configure_optimizers
    return task


def test_accumulation_windows_count_steps(tmp_path: Any) -> None:
    """Deliberate difference (docs/porting.md): with accumulate_grad_batches=2 and one read per step, Tandem
    zeroes the gradients at each window's first step, so the weights equal Lightning's ordinary-step run.
    Lightning decides by the batch index fetched before the step (0 for the first two steps) and zeroes the
    first step's gradients again: its dataloader_iter run trains differently from its own batch run."""
    reference = _plain_lightning(sched=False)
    _trainer(True, tmp_path, max_epochs=1, accumulate_grad_batches=2).fit(reference, _data(8))
    ours = _task(False, fetches=1)
    _trainer(False, tmp_path, max_epochs=1, accumulate_grad_batches=2).fit(ours, _data(8))
    theirs = _task(True, fetches=1)
    _trainer(True, tmp_path, max_epochs=1, accumulate_grad_batches=2).fit(theirs, _data(8))
    for a, b in zip(ours.layer.parameters(), reference.layer.parameters()):
        torch.testing.assert_close(a, b)
    assert not torch.allclose(theirs.layer.weight, reference.layer.weight)


def test_epoch_scheduler_steps_when_a_step_reads_several_batches(tmp_path: Any) -> None:
    """Deliberate difference (docs/porting.md): an epoch-interval scheduler steps at each epoch's end even when
    the steps read two batches each (as Lightning's ordinary-step run); Lightning's dataloader_iter run never
    steps it then (its epoch ends on the exhausted iterator, which its scheduler check does not look at)."""
    lrs = {}
    for name, lightning, task in (
        ("reference", True, _plain_lightning(sched=True)),
        ("ours", False, _with_step_lr(_task(False, fetches=2))),
        ("theirs", True, _with_step_lr(_task(True, fetches=2))),
    ):
        _trainer(lightning, tmp_path, max_epochs=2).fit(task, _data(8))
        lrs[name] = task.trainer.optimizers[0].param_groups[0]["lr"]
    assert lrs["ours"] == lrs["reference"] == pytest.approx(0.025)
    assert lrs["theirs"] == pytest.approx(0.1)


def test_the_step_gets_the_iterator_alone(tmp_path: Any) -> None:
    """As Lightning: a step that declares `batch_idx` after `dataloader_iter` still gets only the iterator (its
    default stays); what it sees equals Lightning's."""
    base = {True: pl.LightningModule, False: Task}
    seen = {}
    for lightning in (True, False):

        class M(base[lightning]):  # type: ignore[misc,valid-type]
            def __init__(self) -> None:
                super().__init__()
                self.layer, self.got = torch.nn.Linear(4, 1), []

            def validation_step(self, dataloader_iter: Any, batch_idx: int = -7) -> None:
                self.got.append((next(dataloader_iter)[1], batch_idx))

        task = M()
        _trainer(lightning, tmp_path).validate(task, _data(3))
        seen[lightning] = task.got
    assert seen[False] == seen[True] == [(0, -7), (1, -7), (2, -7)]


def test_prediction_writer_refuses_the_flavor(tmp_path: Any) -> None:
    """A prediction writer cannot tell which samples a dataloader_iter predict_step read: as Lightning, a
    NotImplementedError at setup (Tandem's WriterStepError, also a ConfigError)."""
    from pytorch_lightning.callbacks import BasePredictionWriter as LightningWriter

    from callbacks.prediction_writer import BasePredictionWriter, WriterStepError

    for lightning, base in ((True, LightningWriter), (False, BasePredictionWriter)):

        class W(base):  # type: ignore[misc,valid-type]
            def write_on_batch_end(self, *args: Any) -> None: ...

        trainer = _trainer(lightning, tmp_path, callbacks=[W()])
        with pytest.raises(NotImplementedError) as info:
            trainer.predict(_task(lightning), _data(2))
        assert lightning or isinstance(info.value, WriterStepError)


@pytest.mark.parametrize(
    "options",
    [
        dict(fetches=2, max_steps=3, max_epochs=3),
        dict(fetches=2, val_check_interval=2),
        dict(fetches=1, val_check_interval=0.5),
        dict(fetches=1, manual=True, max_steps=5, max_epochs=2),
        dict(fetches=2, check_val_every_n_epoch=2, max_epochs=2),
    ],
)
def test_schedules_count_steps(tmp_path: Any, options: dict[str, Any]) -> None:
    """max_steps, val_check_interval (batches or a fraction) and check_val_every_n_epoch with steps that read
    their own batches: the same reads, hooks, validations and weights as Lightning."""
    _same(tmp_path, _data(8), _data(4), **options)
