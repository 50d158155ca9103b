"""Loggers compared with Lightning's on the same small runs (issue 36): Lightning-style Logger subclasses, CSVLogger,
TensorBoardLogger, the hparams YAML functions, duck-typed loggers, fast_dev_run's DummyLogger."""

from __future__ import annotations

import pytest

pl = pytest.importorskip("pytorch_lightning")

from pytorch_lightning.demos.boring_classes import BoringModel as PLBoring  # noqa: E402

from trainer import Trainer  # noqa: E402
from trainer.demos import BoringModel  # noqa: E402


def _custom_logger(Base):
    class Custom(Base):  # Lightning's style: read-only properties, no directory
        def __init__(self):
            super().__init__()
            self.calls = []

        @property
        def save_dir(self):
            return None

        @property
        def name(self):
            return "custom"

        @property
        def version(self):
            return "1"

        @property
        def experiment(self):
            return None

        def log_hyperparams(self, params, *args, **kwargs):
            self.calls.append(("hparams", dict(params)))

        def log_metrics(self, metrics, step=None):
            self.calls.append(("metrics", sorted(metrics), step))

    return Custom()


class _StepKey:  # logs its own "step" at each epoch end
    def on_train_epoch_end(self):
        self.log_dict({"step": 10 * (self.current_epoch + 1), "train_acc": float(self.current_epoch)})


def _logger_run(lightning: bool, tmp_path):
    from trainer.loggers import Logger

    T, Base, LBase = (
        (pl.Trainer, PLBoring, pl.loggers.Logger) if lightning else (Trainer, BoringModel, Logger)
    )
    model = type("M", (_StepKey, Base), {})()
    logger = _custom_logger(LBase)
    T(default_root_dir=str(tmp_path), max_epochs=2, limit_train_batches=2, limit_val_batches=0, logger=logger,
      log_every_n_steps=1, enable_progress_bar=False, enable_model_summary=False).fit(model)  # fmt: skip
    return logger.calls


def test_a_lightning_style_logger_subclass_gets_lightnings_calls(tmp_path):
    ours, theirs = _logger_run(False, tmp_path / "t"), _logger_run(True, tmp_path / "l")
    assert ours == theirs  # no log_hyperparams without save_hyperparameters; a logged "step" is the step
    assert ("metrics", ["train_acc"], 20) in ours


def _csv_calls(Logger, root):
    import torch

    logger = Logger(str(root), flush_logs_every_n_steps=2)
    logger.log_hyperparams({"a": 1})
    logger.log_hyperparams({"b": "x"})
    logger.log_metrics({"x": torch.tensor(0.5)})  # no step: the number of rows not yet written
    pending = [dict(r) for r in logger.experiment.metrics]
    logger.log_metrics({"x": 1.0, "y": 2}, step=1)  # (1 + 1) % 2 == 0: saved
    after = list(logger.experiment.metrics)
    logger.log_metrics({"y": 3})
    logger.save()
    with open(logger.experiment.metrics_file_path) as f:
        rows = f.read().splitlines()
    with open(f"{logger.log_dir}/{logger.experiment.NAME_HPARAMS_FILE}") as f:
        hparams = f.read()
    return pending, after, rows, hparams


def test_csv_logger_experiment_rows_steps_and_hparams_as_lightnings(tmp_path):
    from trainer.loggers import CSVLogger

    ours = _csv_calls(CSVLogger, tmp_path / "t")
    theirs = _csv_calls(pl.loggers.CSVLogger, tmp_path / "l")
    assert ours == theirs
    assert ours[1] == [] and ours[3] == "a: 1\nb: x\n"


def test_hparams_yaml_functions_round_trip_as_lightnings(tmp_path):
    from argparse import Namespace

    from pytorch_lightning.core.saving import load_hparams_from_yaml as pl_load
    from pytorch_lightning.core.saving import save_hparams_to_yaml as pl_save

    from trainer.loggers.hparams_file import load_hparams_from_yaml, save_hparams_to_yaml

    hp = Namespace(batch_size=32, lr=0.001, nested={"a": [1, 2]}, name="x")
    save_hparams_to_yaml(tmp_path / "ours.yaml", hp)
    pl_save(tmp_path / "theirs.yaml", hp)
    assert (tmp_path / "ours.yaml").read_text() == (tmp_path / "theirs.yaml").read_text()
    assert load_hparams_from_yaml(tmp_path / "ours.yaml") == pl_load(tmp_path / "theirs.yaml") == vars(hp)
    assert load_hparams_from_yaml(tmp_path / "ours.yaml", use_omegaconf=False) == vars(hp)
    with pytest.warns(RuntimeWarning):
        assert load_hparams_from_yaml(tmp_path / "missing.yaml") == {}
    with pytest.raises(RuntimeError):
        save_hparams_to_yaml(tmp_path / "no" / "such.yaml", {})


def test_hparams_yaml_with_a_python_tag_is_refused_where_lightning_runs_it(tmp_path):
    import yaml

    from trainer.loggers.hparams_file import load_hparams_from_yaml

    (tmp_path / "h.yaml").write_text("f: !!python/name:os.system\n")
    with pytest.raises(yaml.YAMLError):  # Lightning's full_load would import os.system
        load_hparams_from_yaml(tmp_path / "h.yaml")


def test_csv_logger_keeps_an_earlier_metrics_file_where_lightning_deletes_it(tmp_path):
    """Deliberate difference (docs/porting.md): a version directory with a metrics.csv (a resumed run, or a
    version given twice) keeps its rows and gets the new ones appended; Lightning warns and deletes the file."""
    from trainer.loggers import CSVLogger

    first = CSVLogger(str(tmp_path), name="exp", version=0)
    first.log_metrics({"loss": 1.0}, step=0)
    first.save()
    again = CSVLogger(str(tmp_path), name="exp", version=0)
    again.log_metrics({"loss": 0.5}, step=1)
    again.save()
    assert (tmp_path / "exp" / "version_0" / "metrics.csv").read_text().splitlines() == [
        "loss,step",
        "1.0,0",
        "0.5,1",
    ]


def test_lightnings_unsupported_loggers_import_and_refuse_when_built():
    from tandem_core.errors import ConfigError
    from trainer.loggers import CometLogger, Logger

    assert issubclass(CometLogger, Logger)  # `isinstance(logger, CometLogger)` in a user's code still works
    with pytest.raises(ConfigError, match="CometLogger is not available"):
        CometLogger(api_key="k", project="p")


def test_tensorboard_logger_writes_hparams_yaml_without_hyperparameters_and_pickles_as_lightnings(tmp_path):
    import pickle

    from trainer.loggers import TensorBoardLogger

    texts = []
    for T, Logger, Model, root in (
        (Trainer, TensorBoardLogger, BoringModel, tmp_path / "t"),
        (pl.Trainer, pl.loggers.TensorBoardLogger, PLBoring, tmp_path / "l"),
    ):
        logger = Logger(save_dir=str(root), default_hp_metric=False)
        T(max_steps=1, default_root_dir=str(root), logger=logger, enable_progress_bar=False).fit(Model())
        texts.append((root / "lightning_logs" / "version_0" / "hparams.yaml").read_text())
        logger.log_metrics({"a": 1.0})
        logger.save()
        pickle.loads(pickle.dumps(logger)).log_metrics({"a": 2.0}, 1)
    assert texts[0] == texts[1] == "{}\n"


class _Duck:  # a logger that is no Logger subclass: Lightning takes any object as one
    name, version, save_dir = "duck", 0, None

    def __init__(self):
        self.seen = []

    def log_metrics(self, metrics, step=None):
        self.seen.append((sorted(metrics), step))

    def log_hyperparams(self, params, *args, **kwargs):
        pass

    def log_graph(self, model, input_array=None):
        pass

    def save(self):
        pass

    def finalize(self, status):
        self.status = status


class _Logs:
    def training_step(self, batch, batch_idx):
        out = super().training_step(batch, batch_idx)
        self.log("a", out["loss"])
        return out


def test_a_duck_typed_logger_is_taken_as_lightning_takes_it(tmp_path):
    from tandem_core.errors import ConfigError

    seen = []
    for T, Base in ((Trainer, BoringModel), (pl.Trainer, PLBoring)):
        duck = _Duck()
        T(default_root_dir=str(tmp_path), max_steps=3, log_every_n_steps=1, logger=duck, enable_progress_bar=False,
          enable_checkpointing=False, enable_model_summary=False).fit(type("M", (_Logs, Base), {})())  # fmt: skip
        seen.append((duck.seen, duck.status))
    assert seen[0] == seen[1] and seen[0][1] == "success"
    with pytest.raises(ConfigError, match="logger must be"):
        Trainer(logger="tensorboard")
