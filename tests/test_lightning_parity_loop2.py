"""Loop behaviour compared with Lightning itself (pytorch_lightning, the reference extra), found by Lightning's
own tests: a fit that trains nothing (limit_train_batches=0, an empty loader, a run already over), ..."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

pl = pytest.importorskip("pytorch_lightning")
from pytorch_lightning.demos import boring_classes as plb  # noqa: E402

from callbacks import Callback  # noqa: E402
from trainer import Trainer, Tuner, demos  # noqa: E402
from trainer.seed import seed_everything  # noqa: E402

QUIET = dict(logger=False, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
HOOKS = (
    "on_fit_start", "on_fit_end", "on_sanity_check_start", "on_sanity_check_end", "on_train_start",
    "on_train_end", "on_train_epoch_start", "on_train_epoch_end", "on_validation_start", "on_validation_end",
)  # fmt: skip


def _trainer(lightning: bool, tmp_path: Any, **kwargs: Any) -> Any:
    cls = pl.Trainer if lightning else Trainer
    return cls(default_root_dir=tmp_path / str(lightning), **{**QUIET, **kwargs})


def _recorder(lightning: bool, calls: list[str]) -> Any:
    cb = (pl.Callback if lightning else Callback)()
    for name in HOOKS:
        setattr(cb, name, lambda *a, _n=name, **k: calls.append(_n))
    return cb


def _recorded_fit(
    lightning: bool, tmp_path: Any, empty: bool = False, again: bool = False, **kwargs: Any
) -> Any:
    calls: list[str] = []
    base = plb.BoringModel if lightning else demos.BoringModel

    class Task(base):  # type: ignore[misc,valid-type]
        def train_dataloader(self) -> Any:
            calls.append("train_dataloader")
            return DataLoader(plb.RandomDataset(32, 0 if empty else 64), batch_size=2)

        def val_dataloader(self) -> Any:
            calls.append("val_dataloader")
            return DataLoader(plb.RandomDataset(32, 64), batch_size=2)

    trainer = _trainer(lightning, tmp_path, callbacks=[_recorder(lightning, calls)], **kwargs)
    task = Task()
    trainer.fit(task)
    if again:  # fit again once the run is over: Lightning trains nothing more
        calls.append("again")
        trainer.fit(task)
    return calls, trainer.current_epoch, trainer.global_step


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize(
    "kwargs",
    [
        dict(limit_train_batches=0, max_epochs=2, limit_val_batches=2),
        dict(limit_train_batches=0, limit_val_batches=0, max_epochs=1, num_sanity_val_steps=0),
        dict(max_epochs=0, limit_val_batches=1),
        dict(max_steps=0, limit_val_batches=1),
        dict(empty=True, max_epochs=1, limit_val_batches=1),
        dict(again=True, max_epochs=1, limit_train_batches=2, limit_val_batches=1),
        dict(again=True, max_steps=3, limit_train_batches=2, limit_val_batches=1),
    ],
    ids=[
        "limit-train-0",
        "limit-train-0-no-val",
        "max-epochs-0",
        "max-steps-0",
        "empty",
        "again",
        "again-steps",
    ],
)
def test_a_fit_that_trains_nothing_runs_only_its_sanity_check_as_lightning(tmp_path, kwargs):
    """As Lightning: no training hooks, no epoch and (limit_train_batches=0) no training loader asked for."""
    assert _recorded_fit(False, tmp_path, **kwargs) == _recorded_fit(True, tmp_path, **kwargs)


class _NoLength(torch.utils.data.IterableDataset):
    def __iter__(self) -> Any:
        return iter(torch.randn(6, 32))


def _val_check_batch(lightning: bool, tmp_path: Any, no_length: bool = False, **kwargs: Any) -> Any:
    trainer = _trainer(lightning, tmp_path, max_epochs=1, **kwargs)
    before = trainer.val_check_batch
    trainer.fit(
        (plb.BoringModel if lightning else demos.BoringModel)(),
        DataLoader(_NoLength(), batch_size=2) if no_length else None,
    )
    return before, trainer.val_check_batch


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize(
    "kwargs",
    [
        dict(val_check_interval=4, limit_train_batches=7),
        dict(val_check_interval=0.5, limit_train_batches=7),
        dict(),
        dict(val_check_interval=0.01),
        dict(val_check_interval=10, check_val_every_n_epoch=None, limit_train_batches=3),
        dict(no_length=True),
        dict(val_check_interval="00:00:00:01", limit_train_batches=2),
        dict(limit_val_batches=0, val_check_interval=0.5),
        dict(limit_train_batches=0),
    ],
    ids=[
        "int",
        "fraction",
        "default",
        "small-fraction",
        "across-epochs",
        "no-length",
        "duration",
        "no-val",
        "no-train",
    ],
)
def test_val_check_batch_reads_back_as_lightning(tmp_path, kwargs):
    assert _val_check_batch(False, tmp_path, **kwargs) == _val_check_batch(True, tmp_path, **kwargs)


def _logged(lightning: bool, tmp_path: Any, **kwargs: Any) -> Any:
    base = plb.BoringModel if lightning else demos.BoringModel
    seen: list[Any] = []

    class Task(base):  # type: ignore[misc,valid-type]
        def training_step(self, *args: Any, **kw: Any) -> Any:
            out = super().training_step(*args, **kw)
            self.log("tl", out["loss"], prog_bar=True)
            self.log("te", out["loss"], on_epoch=True)
            return out

        def validation_step(self, *args: Any, **kw: Any) -> Any:
            out = super().validation_step(*args, **kw)
            self.log("vl", out["x"])
            return out

    class Reader(pl.Callback if lightning else Callback):  # type: ignore[misc]
        def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
            seen.append(("train", sorted(trainer.logged_metrics)))

        def on_validation_batch_end(self, trainer: Any, *args: Any) -> None:
            seen.append(("val", sorted(trainer.logged_metrics)))

    options = {**QUIET, "logger": kwargs.pop("logger", False), **kwargs}
    cls = pl.Trainer if lightning else Trainer
    trainer = cls(default_root_dir=tmp_path / str(lightning), callbacks=[Reader()], **options)
    trainer.fit(Task())
    return sorted(trainer.logged_metrics), seen


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize(
    "kwargs",
    [
        dict(fast_dev_run=True),
        dict(fast_dev_run=2, logger=True),
        dict(max_steps=3, limit_val_batches=2, val_check_interval=2, num_sanity_val_steps=0),
        dict(max_epochs=1, limit_train_batches=2, limit_val_batches=1, num_sanity_val_steps=1, logger=True),
    ],
    ids=["fast-dev-run", "fast-dev-run-logger", "max-steps-before-log-every", "logger-sanity"],
)
def test_logged_metrics_hold_every_logged_value_as_lightning(tmp_path, kwargs):
    """As Lightning: each batch's logged values are in trainer.logged_metrics at its end, even when
    log_every_n_steps did not send them to a logger or none is configured (Lightning's rich metrics_format)."""
    assert _logged(False, tmp_path, **dict(kwargs)) == _logged(True, tmp_path, **dict(kwargs))


def _omegaconf_task(lightning: bool) -> type:
    base = plb.BoringModel if lightning else demos.BoringModel

    class Configured(base):  # type: ignore[misc,valid-type]
        def __init__(self, hparams: Any) -> None:
            super().__init__()
            self.save_hyperparameters(hparams)

    return Configured


def _omegaconf_round_trip(lightning: bool, tmp_path: Any, weights_only: bool) -> list[Any]:
    omegaconf = pytest.importorskip("omegaconf")
    cls = _omegaconf_task(lightning)
    conf = omegaconf.OmegaConf.create(
        {"test_arg": 14, "mylist": [15.4, {"a": 1, "b": 2}], "ref": "${test_arg}"}
    )
    task = cls(conf)
    kept = [type(task.hparams), type(task.hparams_initial), task.hparams == conf]
    trainer = _trainer(lightning, tmp_path, max_epochs=1, limit_train_batches=1, limit_val_batches=1)
    trainer.fit(task)
    path = str(tmp_path / f"{lightning}.ckpt")
    trainer.save_checkpoint(path)
    try:
        loaded = cls.load_from_checkpoint(path, weights_only=weights_only)
    except Exception as e:  # Lightning's safe load refuses the pickled DictConfig
        return [*kept, type(e).__name__]
    return [
        *kept,
        type(loaded.hparams),
        omegaconf.OmegaConf.to_container(loaded.hparams),
        loaded.hparams.mylist[1].b,
    ]


@pytest.mark.filterwarnings("ignore")
def test_a_dictconfig_stays_one_and_comes_back_from_a_checkpoint_as_lightning(tmp_path):
    """save_hyperparameters(DictConfig) keeps the DictConfig (hparams and hparams_initial) and, given to the
    __init__ argument that took it, comes back from load_from_checkpoint(weights_only=False) as Lightning's."""
    assert _omegaconf_round_trip(False, tmp_path, False) == _omegaconf_round_trip(True, tmp_path, False)


@pytest.mark.filterwarnings("ignore")
def test_a_dictconfig_checkpoint_loads_under_the_safe_default_as_plain_data(tmp_path):
    """Deliberate difference (docs/porting.md): Lightning pickles the DictConfig, so its safe load refuses the
    file; Tandem stores it as plain data and rebuilds it with OmegaConf.create, so the default load works."""
    omegaconf = pytest.importorskip("omegaconf")
    ours, theirs = _omegaconf_round_trip(False, tmp_path, True), _omegaconf_round_trip(True, tmp_path, True)
    assert theirs[-1] == "UnpicklingError"
    assert ours[3:] == [
        omegaconf.DictConfig,
        {"test_arg": 14, "mylist": [15.4, {"a": 1, "b": 2}], "ref": 14},
        2,
    ]
    with open(tmp_path / "False.ckpt", "rb") as f:  # plain data: torch's safe loader reads it as it is
        ckpt = torch.load(f, weights_only=True)
    assert ckpt["hparams_type"] == "DictConfig" and ckpt["hparams_name"] == "hparams"


def _lr_find_three_times(lightning: bool, tmp_path: Any) -> list[bool]:
    """Three lr_find calls on one trainer over a task whose loader draws its data when built."""
    (pl.seed_everything if lightning else seed_everything)(1)
    task = (plb.BoringModel if lightning else demos.BoringModel)()
    task.lr = 0.1
    trainer = _trainer(lightning, tmp_path, max_epochs=2, limit_train_batches=10, limit_val_batches=2)
    tuner = (pl.tuner.Tuner if lightning else Tuner)(trainer)
    results = [tuner.lr_find(task).results for _ in range(3)]
    return [r == results[0] and len(r["loss"]) > 10 for r in results[1:]]


@pytest.mark.filterwarnings("ignore")
def test_repeated_lr_find_calls_give_the_same_results_as_lightning(tmp_path):
    """As Lightning, which searches inside isolate_rng: the random state comes back to where it was before
    the search asked for its loaders, so a data set drawn at random when built is the same for each search."""
    assert _lr_find_three_times(False, tmp_path) == _lr_find_three_times(True, tmp_path) == [True, True]


def _nested_omegaconf(lightning: bool, tmp_path: Any) -> list[Any]:
    omegaconf = pytest.importorskip("omegaconf")
    create = omegaconf.OmegaConf.create
    base = plb.BoringModel if lightning else demos.BoringModel

    class Nested(base):  # type: ignore[misc,valid-type]
        def __init__(self, batch_size: int = 64, conf: Any = None, seq: Any = None) -> None:
            super().__init__()
            self.save_hyperparameters()

    task = Nested(conf=create({"p": "anything", "r": "${p}"}), seq=create([1, {"a": 2}]))
    trainer = _trainer(lightning, tmp_path, max_epochs=1, limit_train_batches=1, limit_val_batches=1)
    trainer.fit(task)
    path = str(tmp_path / f"nested{lightning}.ckpt")
    trainer.save_checkpoint(path)
    back = Nested.load_from_checkpoint(path, weights_only=False).hparams
    to = omegaconf.OmegaConf.to_container
    return [type(back.conf), to(back.conf), back.conf.r, type(back.seq), to(back.seq), back.batch_size]


@pytest.mark.filterwarnings("ignore")
def test_dictconfig_and_listconfig_hyperparameters_come_back_as_lightning(tmp_path):
    """A DictConfig or ListConfig among the __init__ arguments comes back as one (its interpolations too)."""
    assert _nested_omegaconf(False, tmp_path) == _nested_omegaconf(True, tmp_path)
