"""Public behaviour found by Lightning's whole CPU suite (issue 43), each compared with Lightning itself on the same
script: a one-element loss of any shape trains, `trainer.state.fn` is settable, `load_from_checkpoint(
hparams_file=...)` and Lightning's tags CSV."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from helpers.lightning_pair import QUIET
from helpers.lightning_pair import pair_trainer as _trainer
from torch.utils.data import DataLoader

pl = pytest.importorskip("pytorch_lightning")
from pytorch_lightning.demos import boring_classes as plb  # noqa: E402

from trainer import Trainer, demos  # noqa: E402
from trainer.seed import seed_everything  # noqa: E402


def _one_element_loss_fit(lightning: bool, tmp_path: Any) -> tuple[list[Any], list[torch.Tensor]]:
    """Lightning's SpikeDetection tests return `layer(x.view(1, 1))`: a loss of shape (1, 1)."""
    base = plb.BoringModel if lightning else demos.BoringModel
    outputs: list[Any] = []

    class Task(base):  # type: ignore[misc,valid-type]
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            return self.layer(batch).sum().view(1, 1)

        def on_train_batch_end(self, out: Any, batch: Any, batch_idx: int) -> None:
            outputs.append(out["loss"].clone())

    seed_everything(1)
    task = Task()
    _trainer(lightning, tmp_path, max_steps=3, limit_val_batches=0).fit(
        task, DataLoader(plb.RandomDataset(32, 8), batch_size=2)
    )
    return outputs, [p.detach().clone() for p in task.parameters()]


def test_a_one_element_loss_of_shape_1_1_trains_as_in_lightning(tmp_path):
    ours, theirs = _one_element_loss_fit(False, tmp_path), _one_element_loss_fit(True, tmp_path)
    assert [o.shape for o in ours[0]] == [o.shape for o in theirs[0]] == [torch.Size([1, 1])] * 3
    torch.testing.assert_close(ours[0], theirs[0])
    torch.testing.assert_close(ours[1], theirs[1])


def test_a_loss_of_several_elements_is_still_refused_like_lightning(tmp_path):
    """Lightning fails in backward ("grad can be implicitly created only for scalar outputs", a RuntimeError);
    Tandem says what to change before it, with a RuntimeError too."""
    for lightning in (False, True):
        base = plb.BoringModel if lightning else demos.BoringModel

        class Task(base):  # type: ignore[misc,valid-type]
            def training_step(self, batch: Any, batch_idx: int) -> Any:
                return self.layer(batch).sum(0)

        with pytest.raises(RuntimeError):
            _trainer(lightning, tmp_path, max_steps=1, limit_val_batches=0).fit(Task())


def test_state_fn_is_settable_as_in_lightning():
    from trainer.states import TrainerFn

    for trainer in (Trainer(**QUIET), pl.Trainer(accelerator="cpu", **QUIET)):
        assert trainer.state.fn is None
        trainer.state.fn = "validate"
        assert trainer.state.fn == "validate"
        trainer.state.fn = (
            TrainerFn.TESTING if isinstance(trainer, Trainer) else pl.trainer.states.TrainerFn.TESTING
        )
        assert trainer.state.fn == "test"


class _Hparams(demos.BoringModel):
    def __init__(self, lr: float = 0.1, name: str = "a") -> None:
        super().__init__()
        self.save_hyperparameters()


class _PlHparams(plb.BoringModel):
    def __init__(self, lr: float = 0.1, name: str = "a") -> None:
        super().__init__()
        self.save_hyperparameters()


@pytest.mark.parametrize("kind", ["yaml", "csv", "txt"])
def test_load_from_checkpoint_with_an_hparams_file_as_in_lightning(tmp_path, kind):
    """The file's hyperparameters replace the checkpoint's; keywords still win; a .txt is a ValueError."""
    from pytorch_lightning.core import saving

    from trainer.loggers import hparams_file

    got = []
    for lightning, cls in ((False, _Hparams), (True, _PlHparams)):
        trainer = _trainer(lightning, tmp_path, max_steps=1, limit_val_batches=0)
        trainer.fit(cls(lr=0.5, name="saved"))
        path = tmp_path / f"{lightning}.ckpt"
        trainer.save_checkpoint(path)
        file = tmp_path / f"{lightning}.{kind}"
        if kind == "yaml":
            (saving if lightning else hparams_file).save_hparams_to_yaml(file, {"lr": 0.25, "name": "file"})
        elif kind == "csv":
            (saving if lightning else hparams_file).save_hparams_to_tags_csv(
                file, {"lr": 0.25, "name": "file"}
            )
        else:
            file.write_text("lr: 0.25\n")
            with pytest.raises(ValueError, match="csv, .yml or .yaml is required"):
                cls.load_from_checkpoint(path, hparams_file=str(file))
            continue
        loaded = cls.load_from_checkpoint(path, hparams_file=str(file))
        kw = cls.load_from_checkpoint(path, hparams_file=str(file), name="kw")
        got.append((dict(loaded.hparams), dict(kw.hparams)))
    if kind != "txt":
        assert got[0] == got[1] == ({"lr": 0.25, "name": "file"}, {"lr": 0.25, "name": "kw"})


def test_tags_csv_round_trip_as_in_lightning(tmp_path):
    """Lightning's legacy meta_tags.csv: each side reads the other's file to the same values."""
    from argparse import Namespace

    from pytorch_lightning.core import saving

    from trainer.loggers import hparams_file

    hparams = {"an_int": 1, "a_float": 2.0, "a_str": "x", "a_list": [1, 2], "a_bool": True, "a_none": None}
    hparams_file.save_hparams_to_tags_csv(tmp_path / "ours.csv", Namespace(**hparams))
    saving.save_hparams_to_tags_csv(tmp_path / "theirs.csv", Namespace(**hparams))
    assert (tmp_path / "ours.csv").read_text() == (tmp_path / "theirs.csv").read_text()
    for name in ("ours.csv", "theirs.csv"):  # None is written as an empty cell: it reads back as ""
        assert hparams_file.load_hparams_from_tags_csv(tmp_path / name) == {**hparams, "a_none": ""}
        assert saving.load_hparams_from_tags_csv(tmp_path / name) == {**hparams, "a_none": ""}
    with pytest.warns(RuntimeWarning):
        assert hparams_file.load_hparams_from_tags_csv(tmp_path / "none.csv") == {}


def test_the_optimizer_wrapper_is_built_from_an_optimizer_as_lightnings():
    """`LightningOptimizer(optimizer)`: an instance of the optimizer's class, its state read and written through;
    Tandem's wrapper writes through to the optimizer itself (Lightning keeps a written state on the wrapper)."""
    from copy import deepcopy

    from pytorch_lightning.core.optimizer import LightningOptimizer

    from trainer import TaskOptimizer

    model = torch.nn.Linear(3, 4)
    for wrap in (TaskOptimizer, LightningOptimizer):
        opt = torch.optim.Adam(model.parameters(), lr=0.1)
        wrapped = wrap(opt)
        assert isinstance(wrapped, wrap) and isinstance(wrapped, torch.optim.Adam)
        assert not isinstance(wrapped, torch.optim.SGD)
        assert wrapped.optimizer is opt and wrapped.param_groups is opt.param_groups
        assert wrapped.state is opt.state and wrapped.defaults is opt.defaults
        opt.param_groups[0]["lr"] = 1.0
        assert wrapped.param_groups[0]["lr"] == 1.0
        saved = deepcopy(opt.state_dict())
        assert wrapped.state_dict() == opt.state_dict()
        other = wrap(torch.optim.Adam(model.parameters(), lr=100))
        other.load_state_dict(saved)
        assert other.param_groups[0]["lr"] == 1.0
        assert type(wrapped).__name__ == ("Task" if wrap is TaskOptimizer else "Lightning") + "Adam"
    ours = TaskOptimizer(opt)
    ours.load_state_dict(saved)
    assert opt.param_groups[0]["lr"] == 1.0  # the optimizer itself was loaded
    with pytest.raises(RuntimeError, match="belongs to no Trainer"):  # Lightning: an AssertionError
        ours.step()
    import pickle

    again = pickle.loads(pickle.dumps(ours))
    assert isinstance(again, torch.optim.Adam) and again.param_groups[0]["lr"] == 1.0


def _toggle_fit(lightning: bool, tmp_path: Any) -> list[torch.Tensor]:
    """Manual optimization stepping under `opt.toggle_model()` (Lightning's GAN pattern, one process)."""
    base = plb.BoringModel if lightning else demos.BoringModel

    class Task(base):  # type: ignore[misc,valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False
            self.other = torch.nn.Linear(32, 2)

        def training_step(self, batch: Any, batch_idx: int) -> None:
            a, b = self.optimizers()
            for opt, layer, sync in ((a, self.layer, batch_idx % 2 == 1), (b, self.other, True)):
                with opt.toggle_model(sync_grad=sync):
                    assert all(
                        not p.requires_grad
                        for p in (self.other if layer is self.layer else self.layer).parameters()
                    )
                    self.manual_backward(
                        layer(batch).sum() + self.other(batch).sum() * 0 + self.layer(batch).sum() * 0
                    )
                    if sync:
                        opt.step()
                        opt.zero_grad()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.layer.parameters(), lr=0.1), torch.optim.SGD(
                self.other.parameters(), lr=0.1
            )

    seed_everything(3)
    task = Task()
    _trainer(lightning, tmp_path, max_epochs=1, limit_train_batches=4, limit_val_batches=0).fit(task)
    assert all(p.requires_grad for p in task.parameters())
    return [p.detach().clone() for p in task.parameters()]


def test_toggle_model_trains_as_lightnings(tmp_path):
    torch.testing.assert_close(_toggle_fit(False, tmp_path), _toggle_fit(True, tmp_path))


def test_logger_and_loggers_setters_as_lightnings(tmp_path):
    from pytorch_lightning.loggers import CSVLogger as PlCSV

    from trainer.loggers import CSVLogger

    for trainer, csv in (
        (Trainer(default_root_dir=tmp_path), CSVLogger),
        (pl.Trainer(default_root_dir=tmp_path), PlCSV),
    ):
        a, b = csv(tmp_path / "a"), csv(tmp_path / "b")
        assert trainer.loggers == [trainer.logger] and trainer.logger is not None
        seen = []
        for value in ([a, b], [a], [], None):
            trainer.loggers = value
            seen.append((list(trainer.loggers), trainer.logger))
        for value in (b, None):
            trainer.logger = value
            seen.append((list(trainer.loggers), trainer.logger))
        assert seen == [([a, b], a), ([a], a), ([], None), ([], None), ([b], b), ([], None)]


def test_state_equals_lightnings_trainer_state():
    from pytorch_lightning.trainer.states import TrainerState as PlState

    from trainer.states import RunningStage, TrainerFn, TrainerState, TrainerStatus

    ours, theirs = Trainer(max_epochs=1, **QUIET), pl.Trainer(max_epochs=1, accelerator="cpu", **QUIET)
    assert ours.state == TrainerState(status=TrainerStatus.INITIALIZING, fn=None, stage=None)
    assert theirs.state == PlState(status="initializing", fn=None, stage=None)
    assert ours.state != TrainerState(status=TrainerStatus.RUNNING)
    for trainer, base in ((ours, demos.BoringModel), (theirs, plb.BoringModel)):
        trainer.fit(base(), DataLoader(plb.RandomDataset(32, 4), batch_size=2))
    assert theirs.state == PlState(status="finished", fn="fit", stage=theirs.state.stage)
    assert ours.state == TrainerState(TrainerStatus.FINISHED, TrainerFn.FITTING, theirs.state.stage)
    assert ours.state != TrainerState(TrainerStatus.FINISHED, TrainerFn.FITTING, RunningStage.TRAINING)
    assert TrainerState().finished is False and TrainerState(status=TrainerStatus.FINISHED).stopped


def _ckpt_fit(lightning: bool, tmp_path: Any, **kwargs: Any) -> Any:
    base = plb.BoringModel if lightning else demos.BoringModel

    class Task(base):  # type: ignore[misc,valid-type]
        def validation_step(self, batch: Any, batch_idx: int) -> Any:
            self.log("foo", -float(batch_idx) - self.current_epoch)
            return super().validation_step(batch, batch_idx)

    trainer = _trainer(
        lightning, tmp_path, **{**dict(max_epochs=2, limit_train_batches=2, limit_val_batches=1), **kwargs}
    )
    task = Task()
    trainer.fit(task)
    return trainer, task


def _outcome(call: Any) -> tuple[str, str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            call()
        except Exception as e:  # noqa: BLE001 (its kind is compared)
            kind = next(k for k in ("FileNotFoundError", "ValueError", "Exception") if isinstance(e, eval(k)))
            return "raises", kind
    said = [
        str(w.message) for w in caught if "ckpt_path" in str(w.message) or "No checkpoint" in str(w.message)
    ]
    return "warns" if said else "quiet", said[0][:40] if said else ""


def _ckpt_cases(lightning: bool, tmp_path: Any) -> list[Any]:
    from pytorch_lightning.callbacks import ModelCheckpoint as PlMC

    from callbacks import ModelCheckpoint

    mc = PlMC if lightning else ModelCheckpoint
    got = []
    trainer, task = _ckpt_fit(lightning, tmp_path, callbacks=[mc(monitor="foo")], enable_checkpointing=True)
    best = trainer.checkpoint_callback.best_model_path
    got.append(_outcome(lambda: trainer.validate()))  # no model: the best of the previous fit, with a warning
    got.append(trainer.ckpt_path == best)
    got.append(_outcome(lambda: trainer.validate(task)))  # a model: nothing loaded
    got.append(trainer.ckpt_path)
    got.append(_outcome(lambda: trainer.test(ckpt_path="best")))
    got.append(trainer.ckpt_path == best)
    got.append(_outcome(lambda: trainer.predict(ckpt_path="last")))  # no save_last: a warning, nothing loaded
    got.append(trainer.ckpt_path)
    got.append(_outcome(lambda: trainer.test(ckpt_path=str(tmp_path / "random.ckpt"))))
    trainer, task = _ckpt_fit(lightning, tmp_path / "none", enable_checkpointing=False)
    got.append(_outcome(lambda: trainer.validate(ckpt_path="best")))
    got.append(_outcome(lambda: trainer.validate()))  # no ModelCheckpoint: Lightning's "best" fails too
    trainer, task = _ckpt_fit(
        lightning, tmp_path / "k0", callbacks=[mc(monitor="foo", save_top_k=0)], enable_checkpointing=True
    )
    got.append(_outcome(lambda: trainer.test(ckpt_path="best")))
    trainer = _trainer(
        lightning, tmp_path / "fresh", max_epochs=1, limit_train_batches=1, limit_val_batches=0
    )
    got.append(
        _outcome(
            lambda: trainer.fit((plb.BoringModel if lightning else demos.BoringModel)(), ckpt_path="last")
        )
    )
    got.append(trainer.ckpt_path)
    return got


def test_ckpt_path_best_last_none_and_a_missing_file_as_in_lightning(tmp_path):
    ours, theirs = _ckpt_cases(False, tmp_path / "t"), _ckpt_cases(True, tmp_path / "l")
    assert [o[0] if isinstance(o, tuple) else o for o in ours] == [
        t[0] if isinstance(t, tuple) else t for t in theirs
    ]
    kinds = lambda got: [o[1] for o in got if isinstance(o, tuple) and o[0] == "raises"]  # noqa: E731
    assert kinds(ours) == kinds(theirs) == ["FileNotFoundError", "ValueError", "ValueError", "ValueError"]


def test_a_checkpoint_url_loads_and_a_mismatch_is_a_runtime_error_as_in_lightning(tmp_path, monkeypatch):
    """load_from_checkpoint and ckpt_path take an http URL (downloaded under TORCH_HOME); a checkpoint with extra
    weights is a RuntimeError under strict loading and loads with strict=False."""
    import functools
    import http.server
    import threading

    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "hub"))
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            got = []
            for lightning, base in ((False, demos.BoringModel), (True, plb.BoringModel)):
                seed_everything(0)
                task = base()
                task.extra = torch.nn.Linear(2, 2)
                trainer = _trainer(lightning, tmp_path, max_steps=2, limit_val_batches=0)
                trainer.fit(task)
                trainer.save_checkpoint(tmp_path / f"{lightning}.ckpt")
                url = f"http://127.0.0.1:{server.server_address[1]}/{lightning}.ckpt"
                with pytest.raises(RuntimeError):
                    base.load_from_checkpoint(url)
                loaded = base.load_from_checkpoint(url, strict=False)
                got.append(loaded.layer.weight.detach().clone())
                assert torch.equal(loaded.layer.weight, task.layer.weight)
                with pytest.raises(OSError):  # Lightning: urllib's HTTPError; Tandem: a FileNotFoundError
                    base.load_from_checkpoint(f"http://127.0.0.1:{server.server_address[1]}/missing.ckpt")
                trainer.validate(task, ckpt_path=url)
                assert trainer.ckpt_path is not None
        finally:
            server.shutdown()
            thread.join()
