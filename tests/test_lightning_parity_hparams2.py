"""save_hyperparameters and load_from_checkpoint as Lightning's own tests (models/test_hparams.py) found them,
each run on the same classes under Lightning and Tandem: a plain mixin's arguments collected, a dataclass task,
a subclass's `ignore` dropping what its base saved, Lightning's errors and warnings, a non-plain hyperparameter
given back by a trusted load, older checkpoint keys and keywords __init__ does not take."""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import pytest
import torch

pl = pytest.importorskip("pytorch_lightning")
from pytorch_lightning.demos import boring_classes as plb  # noqa: E402

from trainer import DataModule, Trainer, demos  # noqa: E402

QUIET = dict(logger=False, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)


def _classes(lightning: bool) -> dict[str, Any]:
    base = plb.BoringModel if lightning else demos.BoringModel

    class Mixin:  # a plain class in the chain: its arguments are collected too
        def __init__(self, *args: Any, mixin_arg: int = 1200, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.save_hyperparameters()

    class Custom(base):  # type: ignore[misc,valid-type]
        def __init__(self, batch_size: int = 64) -> None:
            super().__init__()
            self.save_hyperparameters()

    class WithMixin(Mixin, Custom):
        pass

    class Base(base):  # type: ignore[misc,valid-type]
        def __init__(self, arg1: int, arg2: int, arg3: int) -> None:
            super().__init__()
            self.save_hyperparameters(ignore="arg1")

    class Sub(Base):
        def __init__(self, arg1: int, arg2: int, arg3: int) -> None:
            super().__init__(arg1=arg1, arg2=arg2, arg3=arg3)
            self.save_hyperparameters(ignore="arg2")

    @dataclasses.dataclass(eq=False)
    class Data(base):  # type: ignore[misc,valid-type]
        mandatory: int
        optional: str = "optional"
        later: int = dataclasses.field(default=9, init=False)

        def __post_init__(self) -> None:
            super().__init__()
            self.save_hyperparameters()

    class One(base):  # type: ignore[misc,valid-type]
        def __init__(self, arg1: Any) -> None:
            super().__init__()
            self.save_hyperparameters(arg1)

    class Modules(base):  # type: ignore[misc,valid-type]
        def __init__(self, encoder: Any, other: int = 7) -> None:
            super().__init__()
            self.save_hyperparameters()

    class Lambda(base):  # type: ignore[misc,valid-type]
        def __init__(self, foo: str = "bar", fn: Any = lambda x: x + 1) -> None:
            super().__init__()
            self.save_hyperparameters()

    return dict(WithMixin=WithMixin, Sub=Sub, Data=Data, One=One, Modules=Modules, Lambda=Lambda)


def _said(call: Any) -> tuple[Any, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            out = call()
        except ValueError as e:
            out = f"ValueError: {e}"
    return out, [
        str(w.message)[:60] for w in caught if "hparams" in str(w.message) or "nn.Module" in str(w.message)
    ]


def _run(lightning: bool) -> list[Any]:
    c = _classes(lightning)
    trainer_cls = (lambda **k: pl.Trainer(accelerator="cpu", **k)) if lightning else Trainer
    got: list[Any] = [dict(c["WithMixin"](batch_size=3).hparams), dict(c["Sub"](1, 2, 3).hparams)]
    got.append(dict(c["Data"](33, optional="x").hparams))
    got.append(_said(lambda: c["One"](42))[0])
    got.append(_said(lambda: c["One"]({"a": 1}).hparams["a"]))
    got.append(_said(lambda: list(c["Modules"](torch.nn.Linear(1, 1)).hparams)))
    task = c["Lambda"]()
    trainer = trainer_cls(max_steps=1, limit_val_batches=0, **QUIET)
    got.append(_said(lambda: trainer.fit(task))[1])
    got.append(sorted(task.hparams))
    return got


def test_save_hyperparameters_as_lightnings():
    ours, theirs = _run(False), _run(True)
    assert ours == theirs
    assert ours[0] == {"batch_size": 3, "mixin_arg": 1200} and ours[1] == {"arg1": 1, "arg3": 3}
    assert ours[3].startswith("ValueError: Primitives") and ours[5][1] and ours[6] and ours[7] == ["foo"]


class _PlNet(plb.BoringModel):
    def __init__(self, loss: Any = None, batch_size: int = 64) -> None:
        super().__init__()
        self.save_hyperparameters()


class _Net(demos.BoringModel):
    def __init__(self, loss: Any = None, batch_size: int = 64) -> None:
        super().__init__()
        self.save_hyperparameters()


def test_load_from_checkpoint_as_lightnings(tmp_path):
    """A module hyperparameter comes back from a trusted load (Lightning pickles it; Tandem stores its pickle as
    bytes, read only with weights_only=False, so that the default load stays plain data); Lightning's older
    hparams keys are read; a keyword __init__ does not take is dropped (Tandem says so)."""
    got = []
    for lightning, cls in ((True, _PlNet), (False, _Net)):
        kwargs = dict(max_steps=1, limit_val_batches=0, **QUIET)
        trainer = pl.Trainer(accelerator="cpu", **kwargs) if lightning else Trainer(**kwargs)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(cls(loss=torch.nn.CosineEmbeddingLoss(margin=0.5), batch_size=5))
        path = tmp_path / f"{lightning}.ckpt"
        trainer.save_checkpoint(path)
        trusted = cls.load_from_checkpoint(path, weights_only=False)
        row = [type(trusted.hparams.loss).__name__, trusted.hparams.loss.margin, trusted.hparams.batch_size]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            row.append(
                dict(cls.load_from_checkpoint(path, weights_only=False, not_an_arg=1).hparams)["batch_size"]
            )
        raw = torch.load(path, weights_only=False)
        raw["module_arguments"] = {**raw.pop("hyper_parameters"), "batch_size": -17, "loss": None}
        torch.save(raw, path)
        row.append(cls.load_from_checkpoint(path, weights_only=False).hparams.batch_size)
        got.append(row)
    assert got[0] == got[1] == ["CosineEmbeddingLoss", 0.5, 5, 5, -17]
    with pytest.raises(
        Exception, match="loss"
    ):  # Tandem's default load: plain data, the module is not unpickled
        trainer = Trainer(max_steps=1, limit_val_batches=0, **QUIET)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(_Net(loss=torch.nn.CosineEmbeddingLoss()))
        trainer.save_checkpoint(tmp_path / "plain.ckpt")
        _Net.load_from_checkpoint(tmp_path / "plain.ckpt")
    with pytest.warns(UserWarning, match="not_an_arg"):
        _Net.load_from_checkpoint(tmp_path / "plain.ckpt", loss=None, not_an_arg=1)


def test_datamodule_checkpoint_keys_are_lightnings():
    for name in (
        "CHECKPOINT_HYPER_PARAMS_KEY",
        "CHECKPOINT_HYPER_PARAMS_NAME",
        "CHECKPOINT_HYPER_PARAMS_TYPE",
    ):
        assert getattr(DataModule, name) == getattr(pl.LightningDataModule, name)
    from pytorch_lightning.loggers import TensorBoardLogger as PlTB

    from trainer.loggers import TensorBoardLogger

    assert TensorBoardLogger.NAME_HPARAMS_FILE == PlTB.NAME_HPARAMS_FILE
